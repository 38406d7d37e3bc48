"""触发器跳过没有统计行的知识库：整库清理先删掉统计与倒排（``search.bm25.statistics_drop``），之后逐批删分块时
触发器不再逐行维护倒排；统计行被删时，一个语句级触发器把这个知识库剩下的倒排一并删掉。

以前清理走触发器逐行删倒排：删 1,000 个分块（约 28 万行倒排）约 8 s，1M 分块的知识库要按小时计。规则是
“统计行不在 = 这个知识库不计统计”：每条语句先按净增量建（或更新）统计行——新知识库的第一批分块照常建起统计；
之后的词统计与倒排语句只处理统计行存在的知识库。已删掉统计的知识库只剩删除（净减少，不会重建统计行），
于是整条跳过；清理期间才写入的分块会重新建起统计行，照常计数，清理结束时再被 statistics_drop 清掉。
"""

import importlib

from django.db import migrations

_impact = importlib.import_module("search.migrations.0002_impact_ordered_postings")

_TRACKED = "EXISTS (SELECT 1 FROM fulltext_kb_stats x WHERE x.knowledge_base_id = d.kb)"


def _skip_untracked(sql: str) -> str:
    """在词统计与倒排的四条语句里只保留有统计行的知识库的增量。"""
    replacements = [
        # 词统计 upsert 与删除 df 归零的词行
        ("FROM unnest(deltas) d, unnest(tsvector_to_array(d.sv)) AS l(lexeme)\n    GROUP BY",
         f"FROM unnest(deltas) d, unnest(tsvector_to_array(d.sv)) AS l(lexeme)\n    WHERE {_TRACKED}\n    GROUP BY"),
        ("unnest(tsvector_to_array(d.sv)) AS l(lexeme)\n           WHERE d.sign < 0) g",
         f"unnest(tsvector_to_array(d.sv)) AS l(lexeme)\n           WHERE d.sign < 0 AND {_TRACKED}) g"),
        # 倒排的删除与插入
        ("FROM unnest(deltas) d, unnest(d.sv) u WHERE d.sign < 0) g",
         f"FROM unnest(deltas) d, unnest(d.sv) u WHERE d.sign < 0 AND {_TRACKED}) g"),
        ("FROM unnest(deltas) d, unnest(d.sv) u WHERE d.sign > 0) g",
         f"FROM unnest(deltas) d, unnest(d.sv) u WHERE d.sign > 0 AND {_TRACKED}) g"),
    ]
    for old, new in replacements:
        assert sql.count(old) == 1, old
        sql = sql.replace(old, new)
    return sql


APPLY_FUNCTION_SQL = _skip_untracked(_impact.APPLY_FUNCTION_SQL)

# 统计行删掉时，这个知识库剩下的倒排一并删掉：不论是 statistics_drop、ORM 级联删库（统计行可能先于分块被删）
# 还是手工删除，“没有统计行的知识库没有倒排”都成立，跳过的那些删除不会留下孤儿倒排
DROPPED_TRIGGER_SQL = """
CREATE FUNCTION fulltext_kb_stats_dropped() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM fulltext_postings p USING old_rows o WHERE p.knowledge_base_id = o.knowledge_base_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER fulltext_kb_stats_dropped AFTER DELETE ON fulltext_kb_stats
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION fulltext_kb_stats_dropped();
"""

DROPPED_TRIGGER_REVERSE_SQL = """
DROP TRIGGER fulltext_kb_stats_dropped ON fulltext_kb_stats;
DROP FUNCTION fulltext_kb_stats_dropped();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("search", "0003_postings_autovacuum"),
    ]

    operations = [
        migrations.RunSQL(APPLY_FUNCTION_SQL + DROPPED_TRIGGER_SQL,
                          DROPPED_TRIGGER_REVERSE_SQL + _impact.APPLY_FUNCTION_SQL),
    ]
