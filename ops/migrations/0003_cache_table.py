"""创建 django-q2 心跳用的数据库缓存表（CACHES["cluster"]）。

以前只有 ``manage.py serve`` 会执行 createcachetable；按常见容器布局只跑 ``migrate`` 再起 gunicorn 与
qcluster 的部署里这张表不存在，worker 心跳写不进去，/ready 永远 503。放进迁移后 ``migrate`` 就足够。
"""

from django.conf import settings
from django.core.management import call_command
from django.db import migrations


def _cache_table() -> str:
    return str(settings.CACHES["cluster"]["LOCATION"])


def create_cache_table(apps, schema_editor):
    # createcachetable 对已存在的表什么也不做（老部署里 serve 早已建过），因此可重复执行
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


def drop_cache_table(apps, schema_editor):
    schema_editor.execute(f"DROP TABLE IF EXISTS {schema_editor.quote_name(_cache_table())}")


class Migration(migrations.Migration):
    dependencies = [("ops", "0002_reaper_schedule")]

    operations = [migrations.RunPython(create_cache_table, drop_cache_table)]
