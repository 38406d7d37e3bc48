"""全文存储 v7：每个段按序号存一份分块的长度字节（``fulltext_segments.norms``），新写的倒排块不再逐条带它。

SQL 读自 ``search/sql/fulltext_storage.v7.sql``（``frozen_sql`` 按这里记下的 SHA-256 读）。已有的段这一列为 NULL，
它们的块自带长度字节，照旧可读。回退删掉这一列——之前要先让旧代码能读的段都在（回退前 ``rebuild`` 每个知识库）。
"""

from django.db import migrations

from ._frozen_sql import frozen_sql

STORAGE_SQL = frozen_sql("fulltext_storage.v7.sql", "ae59c7fa0b748db1ceb55f9df73d0b32ba2909279c68fdb21fe41b95d39fe683")
DROP_SQL = "ALTER TABLE fulltext_segments DROP COLUMN norms;"


class Migration(migrations.Migration):

    dependencies = [
        ('search', '0014_fulltext_update_skips_unchanged'),
    ]

    operations = [
        migrations.RunSQL(STORAGE_SQL, DROP_SQL),
    ]
