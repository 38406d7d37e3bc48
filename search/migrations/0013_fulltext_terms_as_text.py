"""触发器函数 v4：读分块的词位时转成 tsvector（``search_vector::tsvector``），为 ``documents.0013`` 把这一列改存
tsvector 的文本形式做准备。

转换对 tsvector 本身是空操作，所以 v4 在列改类型之前、之后都对：这个迁移先换函数，``documents.0013`` 依赖它、
再改列，升级中途任何一刻触发器与列都配得上。回退换回 v3（那时列已由 ``documents.0013`` 的回退改回 tsvector）。
"""

from django.db import migrations

from ._frozen_sql import frozen_sql

MAINTAIN_SQL = frozen_sql("fulltext_stats_maintain.v4.sql", "87bb00faffc08934ffdcfe945a15297fcb291452b375b7fa84ae9cd771e75c88")
MAINTAIN_V3_SQL = frozen_sql("fulltext_stats_maintain.v3.sql", "38d67759361c15d17f748d14156f338fe2a111ed60ad733c00b64c872d47d43c")


class Migration(migrations.Migration):

    dependencies = [
        ('search', '0012_fulltext_segment_created_at'),
    ]

    operations = [
        migrations.RunSQL(MAINTAIN_SQL, MAINTAIN_V3_SQL),
    ]
