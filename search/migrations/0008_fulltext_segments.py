"""全文引擎 v2：压缩的块倒排（段）+ 只追加的写入（L0），取代 v1 每个 (词位, 分块) 一行的倒排与词统计表。

SQL 读自 ``search/sql/`` 里的文件（``frozen_sql`` 按这里记下的 SHA-256 读）：v1 的 ``fulltext_stats_apply`` 与
``fulltext_impact`` 退役（它们的 v2 文件就是 DROP），触发器函数换成只往 L0 追加一行的 v2，存储 v2 删掉倒排表、
建起 L0、段、词典、倒排块、序号与删除集。统计行加两列（下一个序号与段号），词统计表删除。

已有的分块不重新切词、不重新向量化：最后一步把每个有统计行的知识库的可检索分块一次放进 L0（与触发器同一个
词项定义 ``fulltext_chunk_terms``），检索立即可用；``manage.py compact_fulltext`` 或每分钟的定时任务再把它们
合并成段（分批提交、带进度，中断后再运行接着做）。不可回退：v1 的倒排要由 v1 的函数重建，回退请用旧版本重建库。
"""

from django.db import migrations, models

from ._frozen_sql import frozen_sql

APPLY_RETIRED_SQL = frozen_sql("fulltext_stats_apply.v2.sql", "100053db9fdff026b4e8a1baad0954e75515e63eedf39de3749437fe9a72b09a")
IMPACT_RETIRED_SQL = frozen_sql("fulltext_impact.v2.sql", "7eebd26b5c6cfd2a9f20eb36cb4e707ca9fc8cf89625f5eb4ac9d3332426e939")
STORAGE_SQL = frozen_sql("fulltext_storage.v2.sql", "e983e7421b004e317ccd514f81d43d27eee66dc74b1c0c9ff953c042db3dfc78")
CHUNK_TERMS_SQL = frozen_sql("fulltext_chunk_terms.v1.sql", "f6892a77da553155cf03df04879cbffafcaf5c60ab9fb47eba6ff68d8eb08aae")
MAINTAIN_SQL = frozen_sql("fulltext_stats_maintain.v2.sql", "fdc3b3f0ea00d12c1ba7a8115f80eab31a5fc8be8b1726d59cfc6be530fb6ab6")
KB_STATS_DROPPED_SQL = frozen_sql("fulltext_kb_stats_dropped.v2.sql", "dfd67ef0d4e98471b999d8544d6d4b584b217b880e7e533edfa8f411ddf98d0b")

# 已有分块放进 L0：段里还什么都没有，统计行的计数归零（N = 统计行 + L0 − 删除集）。
# 没有统计行的知识库（v1 整库清理到一半的）不放：规则照旧是“没有统计行就没有全文数据”
BACKFILL_SQL = """
UPDATE fulltext_kb_stats SET chunk_count = 0, total_length = 0, next_ordinal = 0, next_segment = 0;
INSERT INTO fulltext_l0 (knowledge_base_id, chunk_id, length, lexemes, title_tf, body_tf)
SELECT c.knowledge_base_id, c.id, coalesce(c.search_length, 0), t.lexemes, t.title_tf, t.body_tf
FROM document_chunks c JOIN fulltext_kb_stats s ON s.knowledge_base_id = c.knowledge_base_id
CROSS JOIN LATERAL fulltext_chunk_terms(c.search_vector) t
WHERE c.role <> 'parent';
"""


class Migration(migrations.Migration):

    dependencies = [
        ('search', '0007_relevance_hybrid_monotone'),
    ]

    operations = [
        # 先换掉触发器函数（v2 不再调用 fulltext_stats_apply），再退役 v1 的两个函数、换存储
        migrations.RunSQL(MAINTAIN_SQL),
        migrations.RunSQL(APPLY_RETIRED_SQL),
        migrations.RunSQL(IMPACT_RETIRED_SQL),
        migrations.RunSQL(STORAGE_SQL),
        migrations.RunSQL(CHUNK_TERMS_SQL),
        migrations.RunSQL(KB_STATS_DROPPED_SQL),
        migrations.AddField(
            model_name='fulltextkbstats',
            name='next_ordinal',
            field=models.IntegerField(db_default=0, default=0, verbose_name='下一个分块序号'),
        ),
        migrations.AddField(
            model_name='fulltextkbstats',
            name='next_segment',
            field=models.IntegerField(db_default=0, default=0, verbose_name='下一个段号'),
        ),
        migrations.DeleteModel(
            name='FulltextTermStats',
        ),
        migrations.RunSQL(BACKFILL_SQL),
    ]
