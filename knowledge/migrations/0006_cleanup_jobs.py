"""清理任务的尝试次数与重试时间搬进作业表（jobs.Job）：还没做完的清理任务各建一个排队的作业（快队列），
回收器第一次运行就把它们交给队列。见 documents.0010 的说明。"""

from django.conf import settings
from django.db import migrations


def cleanups_to_jobs(apps, schema_editor):
    task_model = apps.get_model("knowledge", "CleanupTask")
    job_model = apps.get_model("jobs", "Job")
    job_model.objects.bulk_create([
        job_model(kind="cleanup", target_id=task.id, knowledge_base_id=task.knowledge_base_id,
                  queue=settings.FAST_QUEUE, status="queued", attempt=task.attempts, run_after=task.next_retry_at,
                  request_id=task.request_id)
        for task in task_model.objects.filter(status__in=["pending", "running"])
    ])


class Migration(migrations.Migration):

    dependencies = [
        ('knowledge', '0005_vector_compression'),
        ('jobs', '0001_initial'),
    ]

    operations = [
        migrations.RunPython(cleanups_to_jobs, migrations.RunPython.noop),
        migrations.RemoveField(model_name='cleanuptask', name='attempts'),
        migrations.RemoveField(model_name='cleanuptask', name='next_retry_at'),
    ]
