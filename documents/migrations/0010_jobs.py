"""文档不再兼做作业：尝试次数、重试时间、租约与 worker 死亡次数搬进作业表（jobs.Job）。

还没处理完的文档（处理中、等待或正在重新索引）各建一个排队的作业，带上原来的尝试次数、死亡次数与重试时间；
``pushed_at`` 留空，回收器第一次运行（每分钟）就把它们交给各自的队列。升级前入队的消息参数是文档 id，
新的任务函数找不到这个作业就跳过。与每次升级一样，迁移时 worker 应已停止（``manage.py serve`` 先迁移再启动 worker）。
"""

from django.conf import settings
from django.db import migrations


def documents_to_jobs(apps, schema_editor):
    document_model = apps.get_model("documents", "Document")
    job_model = apps.get_model("jobs", "Job")
    pending = document_model.objects.filter(status="processing") | document_model.objects.filter(
        status="completed", reindex_status__in=["queued", "running"])
    jobs = []
    for document in pending.iterator():
        small = document.size_bytes <= settings.FAST_QUEUE_MAX_BYTES
        jobs.append(job_model(
            kind="ingest", target_id=document.id, knowledge_base_id=document.knowledge_base_id,
            queue=settings.FAST_QUEUE if small else settings.Q_CLUSTER["name"], status="queued",
            attempt=document.attempts, worker_deaths=document.worker_deaths, run_after=document.next_retry_at,
            request_id=document.request_id,
        ))
    job_model.objects.bulk_create(jobs, batch_size=1000)
    document_model.objects.filter(reindex_status="running").update(reindex_status="queued", stage="")
    document_model.objects.filter(status="processing").update(stage="")


class Migration(migrations.Migration):

    dependencies = [
        ('documents', '0009_drop_redundant_fk_indexes'),
        ('jobs', '0001_initial'),
    ]

    operations = [
        migrations.RunPython(documents_to_jobs, migrations.RunPython.noop),
        migrations.RemoveField(model_name='document', name='attempts'),
        migrations.RemoveField(model_name='document', name='lease_expires_at'),
        migrations.RemoveField(model_name='document', name='lease_owner'),
        migrations.RemoveField(model_name='document', name='next_retry_at'),
        migrations.RemoveField(model_name='document', name='worker_deaths'),
    ]
