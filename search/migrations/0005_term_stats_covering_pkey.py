"""词位统计的主键带上 df（``INCLUDE``），前缀词的 df 走仅索引扫描；这张表也及早清理。

前缀词（孤立的单字，``'人':*``）的 “df” 是以它开头的各词位 df 之和：主键上的一段范围。主键不含 df 时要逐行
回表，而表按写入顺序存放，一段范围散在几千个堆页上：100k 分块的库里常见单字的那一段有 4~5 千个词位，
求和要 11~16 ms，占到带前缀词的查询全文路时间的一半。主键带上 df 以后同一段只读二三十个索引页（<1 ms）。

代价：df 进了索引，摄取更新词行时不再是 HOT 更新，每次更新多写一个索引项；摄取的时间大头在 embedding。
仅索引扫描要可见性映射：词行被摄取不停地更新，默认的 20% 死行比例太迟，调成 2%（与倒排表一致，见 0003）。

换主键不锁住检索：先 ``CREATE UNIQUE INDEX CONCURRENTLY`` 建好新索引，再在一条 ALTER 里换掉约束
（只改目录，瞬间完成）。所以这个迁移不能在事务里跑。
"""

from django.db import migrations

_TABLE = "fulltext_term_stats"
_PKEY = "fulltext_term_stats_pkey"
_NEW = "fulltext_term_stats_pkey_df"


def _swap(include: str) -> list[str]:
    """建好（可能带 INCLUDE 的）新唯一索引，再让它接替主键。中途失败后可以重跑：先删掉上次留下的半成品再建。"""
    return [
        f"DROP INDEX CONCURRENTLY IF EXISTS {_NEW}",  # 上次 CONCURRENTLY 失败会留下无效索引
        f"CREATE UNIQUE INDEX CONCURRENTLY {_NEW} ON {_TABLE} (knowledge_base_id, lexeme){include}",
        f"ALTER TABLE {_TABLE} DROP CONSTRAINT {_PKEY}, ADD CONSTRAINT {_PKEY} PRIMARY KEY USING INDEX {_NEW}",
    ]


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("search", "0004_untracked_kb_skip"),
    ]

    operations = [
        migrations.RunSQL(_swap(" INCLUDE (df)"), _swap("")),
        migrations.RunSQL(
            f"ALTER TABLE {_TABLE} SET (autovacuum_vacuum_scale_factor = 0.02)",
            f"ALTER TABLE {_TABLE} RESET (autovacuum_vacuum_scale_factor)",
        ),
    ]
