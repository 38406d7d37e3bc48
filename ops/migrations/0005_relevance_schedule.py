"""登记每 10 分钟一次的相关概率模型检查（为新的或变化较大的知识库重新拟合，见 search.relevance）。

计时上限（q_options 的 timeout）由 post_migrate 按 RAG_MAINTENANCE_TIMEOUT 写入（ops.tasks.maintenance_schedule_refresh）。
"""

from django.db import migrations

NAME = "search.refresh_relevance_profiles"


def create_schedule(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name=NAME,
        defaults={"func": "ops.tasks.refresh_relevance_profiles", "schedule_type": "I", "minutes": 10, "repeats": -1},
    )


def delete_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("ops", "0004_rate_limit_bucket"),
        ("search", "0006_relevance_profile"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create_schedule, delete_schedule)]
