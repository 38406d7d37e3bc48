"""全文引擎的当前版本：BM25 的知识库级统计表、倒排表、行类型、函数与触发器。取代原来的 search.0001~0005。

SQL 读自 ``search/sql/`` 里的 v1 文件（``frozen_sql`` 按这里记下的 SHA-256 读，文件改了就拒绝加载；
每个文件讲什么、为什么，见文件里的注释与 ``search/fulltext.py``）。得到的表、类型、函数与触发器和按原来的
0001~0005 一步步迁移出来的逐一相同（函数体逐字节相同）。

``replaces``：已经应用过 0001~0005 的库把这个迁移记为已应用，什么也不执行；全新的库只执行这一个。
只应用了其中一部分（停在 0001~0004 之间）的库不能直接升级：Django 加载迁移时就报错，说这个压缩迁移替代不了
部分应用的那几个。这样的库要先用本次改动之前的版本迁移到 search.0005 以后再升级。``search.0006`` 仍按
``0005_term_stats_covering_pkey`` 这个名字依赖它：Django 把这个名字解析到这里；部分应用的库也正因为这个名字
解析不了而在加载时报错，不会跳过 0004、0005 继续往下迁移。代价：``manage.py sqlmigrate`` 加载迁移时不做替换，
在这之前用不了。所有部署都越过这里以后，把 0006 的依赖改成这个迁移的名字、去掉 ``replaces``。

顺序：先建统计表（Django 模型）、倒排表与函数，再用 ``fulltext_stats_apply``（触发器用的同一个函数）把已有分块
一次记进统计与倒排，最后装 ``document_chunks`` 上的触发器。全新部署没有分块，回填什么也不做。
"""

import django.db.models.deletion
from django.db import migrations, models

from ._frozen_sql import frozen_sql

STORAGE_SQL = frozen_sql("fulltext_storage.v1.sql", "564810bbe635abf64cbacb885adf2deda6bb1ec91a383eb7084c2ad9e36773b3")
IMPACT_SQL = frozen_sql("fulltext_impact.v1.sql", "9fc4a4c7abade67b52c2c3f843898a5ae3b53bf47cdb20b23864bee5f7382e26")
APPLY_SQL = frozen_sql("fulltext_stats_apply.v1.sql", "d572d7ccefccceb8bf326494e22f9e176b35a0d99bb61169371f9593a5550661")
KB_STATS_DROPPED_SQL = frozen_sql("fulltext_kb_stats_dropped.v1.sql", "1f1e332589e3c9ff6998ed36198dc0c5ba64b4504ce82c87c751add9949e913d")
MAINTAIN_SQL = frozen_sql("fulltext_stats_maintain.v1.sql", "e7b0d4f4cf9d480fb56875145cb74e76990ca5bf4d7557769ba5376cea0b0e3b")

# 已有分块一次记进统计与倒排：净增量建起各知识库的统计行，再写词统计与倒排，与摄取时触发器做的完全一样
BACKFILL_SQL = """
SELECT fulltext_stats_apply(ARRAY(
    SELECT ROW(knowledge_base_id, id, search_vector, search_length, 1)::fulltext_chunk_delta
    FROM document_chunks WHERE role <> 'parent'));
"""


class Migration(migrations.Migration):

    replaces = [
        ("search", "0001_bm25_statistics"),
        ("search", "0002_impact_ordered_postings"),
        ("search", "0003_postings_autovacuum"),
        ("search", "0004_untracked_kb_skip"),
        ("search", "0005_term_stats_covering_pkey"),
    ]

    initial = True

    dependencies = [
        ('knowledge', '0003_ingestion_fields'),
        ('documents', '0004_chunk_search_length'),
    ]

    operations = [
        migrations.CreateModel(
            name='FulltextKbStats',
            fields=[
                ('knowledge_base', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='fulltext_stats', serialize=False, to='knowledge.knowledgebase', verbose_name='知识库')),
                ('chunk_count', models.BigIntegerField(default=0, verbose_name='分块数')),
                ('total_length', models.BigIntegerField(default=0, verbose_name='词数之和')),
            ],
            options={
                'verbose_name': '全文统计',
                'verbose_name_plural': '全文统计',
                'db_table': 'fulltext_kb_stats',
            },
        ),
        migrations.CreateModel(
            name='FulltextTermStats',
            fields=[
                ('pk', models.CompositePrimaryKey('knowledge_base', 'lexeme', blank=True, editable=False, primary_key=True, serialize=False)),
                ('lexeme', models.TextField(db_collation='C', verbose_name='词位')),
                ('df', models.BigIntegerField(verbose_name='文档频率')),
                ('knowledge_base', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='knowledge.knowledgebase', verbose_name='知识库')),
            ],
            options={
                'verbose_name': '词位文档频率',
                'verbose_name_plural': '词位文档频率',
                'db_table': 'fulltext_term_stats',
            },
        ),
        migrations.RunSQL(STORAGE_SQL, "DROP TABLE fulltext_postings; DROP TYPE fulltext_chunk_delta;"),
        migrations.RunSQL(IMPACT_SQL, "DROP FUNCTION fulltext_impact(integer, integer, integer);"),
        migrations.RunSQL(APPLY_SQL, "DROP FUNCTION fulltext_stats_apply(fulltext_chunk_delta[]);"),
        migrations.RunSQL(KB_STATS_DROPPED_SQL, "DROP TRIGGER fulltext_kb_stats_dropped ON fulltext_kb_stats;"
                                                " DROP FUNCTION fulltext_kb_stats_dropped();"),
        migrations.RunSQL(BACKFILL_SQL, migrations.RunSQL.noop),
        migrations.RunSQL(MAINTAIN_SQL, "DROP TRIGGER document_chunks_fulltext_stats_insert ON document_chunks;"
                                        " DROP TRIGGER document_chunks_fulltext_stats_delete ON document_chunks;"
                                        " DROP TRIGGER document_chunks_fulltext_stats_update ON document_chunks;"
                                        " DROP FUNCTION fulltext_stats_maintain();"),
    ]
