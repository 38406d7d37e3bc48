"""孤儿回收调度改到快队列执行：主队列的 worker 全在跑长摄取时，回收也不必排队。

（调度本身由 ops/migrations/0002 登记；迁移只允许放在 documents 应用里，所以在这里改它的目标集群。）
"""

from django.db import migrations

NAME = "ops.reap_stale_tasks"
FAST_QUEUE = "ragservice-fast"


def to_fast_queue(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).update(cluster=FAST_QUEUE)


def to_default_queue(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).update(cluster=None)


class Migration(migrations.Migration):
    dependencies = [
        ("documents", "0006_document_lease"),
        ("ops", "0002_reaper_schedule"),
    ]

    operations = [migrations.RunPython(to_fast_queue, to_default_queue)]
