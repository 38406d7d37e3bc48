"""登记每分钟一次的全文 L0 合并（``ops.tasks.compact_fulltext``，快队列）：把写入后还没攒够一批的 L0 也合并成段。"""

from django.db import migrations

NAME = "search.compact_fulltext"
FAST_QUEUE = "ragservice-fast"


def create_schedule(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name=NAME,
        defaults={"func": "ops.tasks.compact_fulltext", "schedule_type": "I", "minutes": 1, "repeats": -1,
                  "cluster": FAST_QUEUE},
    )


def delete_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("ops", "0005_relevance_schedule"),
        ("search", "0008_fulltext_segments"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create_schedule, delete_schedule)]
