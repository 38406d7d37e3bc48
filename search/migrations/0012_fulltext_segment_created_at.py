"""全文存储 v6：每个段记下写出的时间（``fulltext_segments.created_at``），维护任务据此判断知识库是否闲下来、
该把批量写入留下的几个段并成大段。

SQL 读自 ``search/sql/fulltext_storage.v6.sql``（``frozen_sql`` 按这里记下的 SHA-256 读）。回退删掉这一列。
"""

from django.db import migrations

from ._frozen_sql import frozen_sql

STORAGE_SQL = frozen_sql("fulltext_storage.v6.sql", "39bc81f6c473f6083aaba063c8b5b7c1e453b3f14c99574aa67540a9e95b8ee9")
DROP_SQL = "ALTER TABLE fulltext_segments DROP COLUMN created_at;"


class Migration(migrations.Migration):

    dependencies = [
        ('search', '0011_fulltext_segment_generation'),
    ]

    operations = [
        migrations.RunSQL(STORAGE_SQL, DROP_SQL),
    ]
