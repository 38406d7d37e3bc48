"""全文存储 v5：每个段一个全局唯一的代号（``fulltext_segments.generation``），检索进程按它缓存段的词典块。

SQL 读自 ``search/sql/fulltext_storage.v5.sql``（``frozen_sql`` 按这里记下的 SHA-256 读）。回退删掉这一列与序列。
"""

from django.db import migrations

from ._frozen_sql import frozen_sql

STORAGE_SQL = frozen_sql("fulltext_storage.v5.sql", "525a6c23054975f012779fb266fa04c255c6ab0f55f3e2c79c416a1b2792baea")
DROP_SQL = """
ALTER TABLE fulltext_segments DROP COLUMN generation;
DROP SEQUENCE fulltext_segment_generation;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('search', '0010_fulltext_document_ids'),
    ]

    operations = [
        migrations.RunSQL(STORAGE_SQL, DROP_SQL),
    ]
