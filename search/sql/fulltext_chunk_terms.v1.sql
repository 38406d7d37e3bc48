-- 一个分块的全文词项（v1）：tsvector → 词位数组与对应的标题、正文词频数组。
--
-- tsvector 的位置权重 A 是标题部分（文件名、文档标题、标题路径，见 raglib.analysis），其余是正文。
-- 写入 L0 的触发器、迁移的回填、重建与核对（search.segments）都用这一个定义，词频的口径只有一处。
-- 空的或为 NULL 的 tsvector 得到三个空数组（这样的分块照样计入分块数 N）。
--
-- 本文件已随迁移 search.0008_fulltext_segments 发布，迁移里记着它的 SHA-256，不要再改：
-- 新版本写成 fulltext_chunk_terms.v2.sql，由一个新迁移应用（见 search/fulltext.py）。
CREATE OR REPLACE FUNCTION fulltext_chunk_terms(sv tsvector, OUT lexemes text[], OUT title_tf smallint[],
                                                OUT body_tf smallint[])
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(u.lexeme), '{}'),
           coalesce(array_agg(coalesce(cardinality(array_positions(u.weights, 'A')), 0)::smallint), '{}'),
           coalesce(array_agg((cardinality(u.weights)
                               - coalesce(cardinality(array_positions(u.weights, 'A')), 0))::smallint), '{}')
    FROM unnest(sv) u
$$;
