"""登记每 10 分钟一次的全文引擎维护（``ops.tasks.maintain_fulltext``）：闲下来的知识库把批量写入留下的几个段
并成大段（``search.segments.merge_idle``）；批量写入之后 L0 空了、它的 GIN 索引还停在写入高峰的大小时重建
（当时的 ``search.segments.shrink_l0``，现在是 ``shrink_indexes``，也重建段的表的索引）。

放在默认（维护）队列：并一个 10 万块的库要一两分钟，REINDEX CONCURRENTLY 要等开始之前的事务结束，不该占着快队列。计时上限（q_options 的
timeout）由 post_migrate 按 RAG_MAINTENANCE_TIMEOUT 写入（ops.tasks.maintenance_schedule_refresh）。
"""

from django.db import migrations

NAME = "search.maintain_fulltext"


def create_schedule(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name=NAME,
        defaults={"func": "ops.tasks.maintain_fulltext", "schedule_type": "I", "minutes": 10, "repeats": -1},
    )


def delete_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("ops", "0006_fulltext_compact_schedule"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create_schedule, delete_schedule)]
