"""倒排表按插入量及早清理：BM25 读倒排靠仅索引扫描，而只有 VACUUM 设过可见性映射的页才能不回表。

默认的 ``autovacuum_vacuum_insert_scale_factor`` 是 0.2：1M 分块（约 2.4 亿行倒排）的知识库要再写进约 20% 的倒排
才清理一次，这期间新写入的倒排分散在各个词位里，查询读到它们就得逐行回表。bench 在 1M 行上量到的差别：刚批量
写入、未清理时全文路 p50 262 ms / p95 902 ms（2 万行倒排回表 1 万次），VACUUM 之后见 bench/README.md。
调成 1%：插入触发的清理只扫可见性映射里没置位的页，代价与新写入的量成正比。
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("search", "0002_impact_ordered_postings"),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE fulltext_postings SET (autovacuum_vacuum_insert_scale_factor = 0.01,"
            " autovacuum_vacuum_scale_factor = 0.02)",
            "ALTER TABLE fulltext_postings RESET (autovacuum_vacuum_insert_scale_factor,"
            " autovacuum_vacuum_scale_factor)",
        ),
    ]
