"""触发器函数 v5：没有改动任何一行全文输入的 UPDATE 不再记进全文引擎。

分块移进知识库自己的向量图（``documents.0015`` 的 ``ann_pending`` 改成假）是一条只改这一列的 UPDATE；v4 把每条
UPDATE 都当成重新索引（记进删除集、追加进 L0、合并时换序号）。回退换回 v4。
"""

from django.db import migrations

from ._frozen_sql import frozen_sql

MAINTAIN_SQL = frozen_sql("fulltext_stats_maintain.v5.sql", "1ea18f36a045a6a7f53ba6aa538486127a68fba362d7c768dda80e701061552b")
MAINTAIN_V4_SQL = frozen_sql("fulltext_stats_maintain.v4.sql", "87bb00faffc08934ffdcfe945a15297fcb291452b375b7fa84ae9cd771e75c88")


class Migration(migrations.Migration):

    dependencies = [
        ('search', '0013_fulltext_terms_as_text'),
    ]

    operations = [
        migrations.RunSQL(MAINTAIN_SQL, MAINTAIN_V4_SQL),
    ]
