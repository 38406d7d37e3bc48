"""倒排表按“影响力”排序：每个词位的倒排行按它对 BM25 分数的贡献上限从高到低连续存放。

1M 分块的知识库里，常见的 bigram 一个词就有几十万行倒排；整条读完再打分，一个查询几百毫秒。按影响力排序后，
常见词只读最前面的一段（工作量由 ``RAG_BM25_MAX_POSTINGS`` 分给各个查询词，见 ``raglib.bm25.allot_postings``），
稀有词照旧整条读。读到的行照常按当前的 IDF、avgdl 精确计分。

影响力 = BM25 的词频饱和项 tfw/(tfw + k1·(1 - b + b·dl/L))，tfw = 2·标题次数 + 正文次数，k1=0.9、b=0.4、
L=256 是写死的常数（不跟知识库的 avgdl 走）：删除分块时触发器要能从分块本身算出同一个值、按主键找到那一行；
排序只决定截断时先读谁，计分用的仍是运行时的参数与统计。
"""

import importlib

from django.db import migrations

_initial = importlib.import_module("search.migrations.0001_bm25_statistics")

IMPACT_FUNCTION_SQL = """
CREATE FUNCTION fulltext_impact(title_tf integer, body_tf integer, len integer) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT floor(32767 * tfw / (tfw + 0.9 * (0.6 + 0.4 * greatest(len, 0) / 256.0)))::smallint
    FROM (SELECT 2.0 * title_tf + body_tf AS tfw) x
$$;
"""

POSTINGS_SQL = """
DROP TABLE fulltext_postings;
CREATE TABLE fulltext_postings (
    -- 不设外键：行的增删全由触发器跟着分块走（外键还会让测试的 TRUNCATE 失败）
    knowledge_base_id uuid NOT NULL,
    lexeme text COLLATE "C" NOT NULL,
    impact smallint NOT NULL,
    chunk_id bigint NOT NULL,
    title_tf smallint NOT NULL,
    body_tf smallint NOT NULL,
    length integer NOT NULL,
    -- 一个词位的行按影响力连续存放：倒着扫主键就是从贡献最大的读起，LIMIT 截断不用排序；
    -- 打分只读 INCLUDE 的几列，走仅索引扫描不回表
    PRIMARY KEY (knowledge_base_id, lexeme, impact, chunk_id) INCLUDE (title_tf, body_tf, length)
);
"""

# 词频从 tsvector 的位置权重数出：A 是标题部分（文件名、文档标题、标题路径），其余是正文。
# 用数组函数而不是 (SELECT count(*) FROM unnest(...))：每行倒排少一次子查询，1M 分块重建时快好几倍
_POSTING_COLUMNS = """
    coalesce(cardinality(array_positions(u.weights, 'A')), 0) AS title_tf,
    coalesce(cardinality(u.weights) - cardinality(array_positions(u.weights, 'A')), 0) AS body_tf
"""

APPLY_FUNCTION_SQL = f"""
CREATE OR REPLACE FUNCTION fulltext_stats_apply(deltas fulltext_chunk_delta[]) RETURNS void LANGUAGE sql
-- 这里的每条语句都该走主键：规划器对 unnest 的行数估计不准，曾经选了对倒排表的顺序扫描 + 哈希连接，
-- 重建 1,311 个分块的 tsvector 用了 5 分钟
SET enable_seqscan = off AS $$
    INSERT INTO fulltext_kb_stats AS s (knowledge_base_id, chunk_count, total_length)
    SELECT d.kb, sum(d.sign), sum(d.sign * coalesce(d.len, 0)) FROM unnest(deltas) d GROUP BY d.kb
    -- 净减少且统计行已不在（ORM 级联删库时统计行可能先于分块被删）：不要凭空插入负数行
    HAVING sum(d.sign) > 0 OR EXISTS (SELECT 1 FROM fulltext_kb_stats x WHERE x.knowledge_base_id = d.kb)
    ORDER BY d.kb
    ON CONFLICT (knowledge_base_id) DO UPDATE
        SET chunk_count = s.chunk_count + EXCLUDED.chunk_count, total_length = s.total_length + EXCLUDED.total_length;
    INSERT INTO fulltext_term_stats AS t (knowledge_base_id, lexeme, df)
    SELECT d.kb, l.lexeme, sum(d.sign) FROM unnest(deltas) d, unnest(tsvector_to_array(d.sv)) AS l(lexeme)
    GROUP BY d.kb, l.lexeme
    HAVING sum(d.sign) > 0 OR (sum(d.sign) < 0 AND EXISTS (
        SELECT 1 FROM fulltext_term_stats x WHERE x.knowledge_base_id = d.kb AND x.lexeme = l.lexeme))
    ORDER BY d.kb, l.lexeme COLLATE "C"
    ON CONFLICT (knowledge_base_id, lexeme) DO UPDATE SET df = t.df + EXCLUDED.df;
    DELETE FROM fulltext_term_stats t
    USING (SELECT DISTINCT d.kb, l.lexeme FROM unnest(deltas) d, unnest(tsvector_to_array(d.sv)) AS l(lexeme)
           WHERE d.sign < 0) g
    WHERE t.knowledge_base_id = g.kb AND t.lexeme = g.lexeme AND t.df <= 0;
    -- 倒排表：先删旧行再插新行（UPDATE 语句里同一分块既在 old_rows 也在 new_rows）。
    -- 影响力由分块自身算出，删除时按完整主键定位
    DELETE FROM fulltext_postings p
    USING (SELECT d.kb, u.lexeme, d.chunk, coalesce(d.len, 0) AS len, {_POSTING_COLUMNS}
           FROM unnest(deltas) d, unnest(d.sv) u WHERE d.sign < 0) g
    WHERE p.knowledge_base_id = g.kb AND p.lexeme = g.lexeme
      AND p.impact = fulltext_impact(g.title_tf, g.body_tf, g.len) AND p.chunk_id = g.chunk;
    INSERT INTO fulltext_postings (knowledge_base_id, lexeme, impact, chunk_id, title_tf, body_tf, length)
    SELECT g.kb, g.lexeme, fulltext_impact(g.title_tf, g.body_tf, g.len), g.chunk, g.title_tf, g.body_tf, g.len
    FROM (SELECT d.kb, u.lexeme, d.chunk, coalesce(d.len, 0) AS len, {_POSTING_COLUMNS}
          FROM unnest(deltas) d, unnest(d.sv) u WHERE d.sign > 0) g;
$$;
"""

# 现有分块按新布局重建倒排表（与 search.bm25 的重算查询一致）
INITIAL_SQL = f"""
INSERT INTO fulltext_postings (knowledge_base_id, lexeme, impact, chunk_id, title_tf, body_tf, length)
SELECT g.kb, g.lexeme, fulltext_impact(g.title_tf, g.body_tf, g.len), g.chunk, g.title_tf, g.body_tf, g.len
FROM (SELECT c.knowledge_base_id AS kb, u.lexeme, c.id AS chunk, c.search_length AS len, {_POSTING_COLUMNS}
      FROM document_chunks c, unnest(c.search_vector) u WHERE c.role <> 'parent') g;
"""

REVERSE_SQL = (
    "DROP TABLE fulltext_postings;"
    + _initial.POSTINGS_TABLE_SQL
    + _initial.APPLY_FUNCTION_SQL.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    + "ALTER FUNCTION fulltext_stats_apply(fulltext_chunk_delta[]) RESET enable_seqscan;"
    + "DROP FUNCTION fulltext_impact(integer, integer, integer);"
    + _initial.POSTINGS_INITIAL_SQL
)


class Migration(migrations.Migration):

    dependencies = [
        ("search", "0001_bm25_statistics"),
    ]

    operations = [
        migrations.RunSQL(IMPACT_FUNCTION_SQL + POSTINGS_SQL + APPLY_FUNCTION_SQL + INITIAL_SQL, REVERSE_SQL),
    ]
