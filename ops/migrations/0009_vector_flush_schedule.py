"""登记每分钟一次的“暂不进图的分块插进知识库自己的图”（``ops.tasks.flush_vector_pending``，快队列）：
写入攒不够一批、没有按知识库入队的，也在一分钟内进图。"""

from django.db import migrations

NAME = "search.flush_vector_pending"
FAST_QUEUE = "ragservice-fast"


def create_schedule(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name=NAME,
        defaults={"func": "ops.tasks.flush_vector_pending", "schedule_type": "I", "minutes": 1, "repeats": -1,
                  "cluster": FAST_QUEUE},
    )


def delete_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("ops", "0008_relevance_schedule_every_minute"),
        ("documents", "0015_chunk_ann_pending"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create_schedule, delete_schedule)]
