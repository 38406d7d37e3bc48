"""相关概率模型的定时检查改为每分钟一次（原来每 10 分钟）：新库摄取完，下一分钟就拟合出自己的模型。

以前新用户摄取完马上试搜，最多要等 10 分钟才有本库的分数，之前是全局校准（向量方式一条都到不了 0.5，README 里的
``min_score: 0.5`` 什么也返回不了）。检查本身是一条按知识库汇总文档表的查询；分块数变化后的重新拟合仍至少隔 10 分钟
（``search.relevance.REFIT_INTERVAL``），大批摄取期间不会一分钟拟合一次。
"""

from django.db import migrations

NAME = "search.refresh_relevance_profiles"


def every(minutes):
    def apply(apps, schema_editor):
        apps.get_model("django_q", "Schedule").objects.filter(name=NAME).update(minutes=minutes)

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("ops", "0007_fulltext_maintenance_schedule"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(every(1), every(10))]
