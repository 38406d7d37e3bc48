"""全文存储 v4：L0 与序号表记下分块所属的文档（``document_id``），没有过滤条件的普通查询回表检查范围时不读分块行。

SQL 读自 ``search/sql/`` 里的文件（``frozen_sql`` 按这里记下的 SHA-256 读）：存储 v4 加列，触发器函数 v3 写 L0 时
带上它。已有的行由这里从 ``document_chunks`` 回填（按主键逐行连接，1M 行的库约一两分钟，期间两张表被锁住）。
回退删掉这两列、换回 v2 的触发器函数。
"""

from django.db import migrations

from ._frozen_sql import frozen_sql

STORAGE_SQL = frozen_sql("fulltext_storage.v4.sql", "09791145f0d6834cbe23b7902b52d2831c9238eca99b4133a4f24dcbaaa9bb32")
MAINTAIN_SQL = frozen_sql("fulltext_stats_maintain.v3.sql", "38d67759361c15d17f748d14156f338fe2a111ed60ad733c00b64c872d47d43c")
MAINTAIN_V2_SQL = frozen_sql("fulltext_stats_maintain.v2.sql", "fdc3b3f0ea00d12c1ba7a8115f80eab31a5fc8be8b1726d59cfc6be530fb6ab6")

# 每个 L0 行与序号行都对应一个还在的分块（删掉的分块由触发器移出这两张表），所以回填之后没有行留着占位的零值
BACKFILL_SQL = """
UPDATE fulltext_l0 l SET document_id = c.document_id FROM document_chunks c WHERE c.id = l.chunk_id;
UPDATE fulltext_docs d SET document_id = c.document_id FROM document_chunks c WHERE c.id = d.chunk_id;
"""
DROP_COLUMNS_SQL = """
ALTER TABLE fulltext_l0 DROP COLUMN document_id;
ALTER TABLE fulltext_docs DROP COLUMN document_id;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('search', '0009_fulltext_prefixes'),
    ]

    operations = [
        migrations.RunSQL(STORAGE_SQL, DROP_COLUMNS_SQL),
        migrations.RunSQL(MAINTAIN_SQL, MAINTAIN_V2_SQL),
        migrations.RunSQL(BACKFILL_SQL, migrations.RunSQL.noop),
    ]
