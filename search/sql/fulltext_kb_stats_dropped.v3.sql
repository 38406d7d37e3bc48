-- 知识库统计行被删时，把这个知识库剩下的全文数据一并删掉（v3：段、词典、倒排块、按首字的 df、序号、删除集及其按词计数与 L0）。
--
-- 规则是“没有统计行的知识库没有全文数据”：删除分块时触发器（fulltext_stats_maintain）整条跳过没有统计行的
-- 知识库。整库清理先用 search.segments.drop 分批删掉大表里的行、最后删统计行，之后逐批删分块不必逐个查找；
-- 不论统计行是 drop、ORM 级联删库（统计行可能先于分块被删）还是手工删掉的，这个触发器都保证不留孤儿行。
--
-- 本文件已随迁移 search.0009_fulltext_prefixes 发布，迁移里记着它的 SHA-256，不要再改：
-- 新版本写成 fulltext_kb_stats_dropped.v4.sql，由一个新迁移应用（见 search/fulltext.py）。
CREATE OR REPLACE FUNCTION fulltext_kb_stats_dropped() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM fulltext_l0 x USING old_rows o WHERE x.knowledge_base_id = o.knowledge_base_id;
    DELETE FROM fulltext_deleted x USING old_rows o WHERE x.knowledge_base_id = o.knowledge_base_id;
    DELETE FROM fulltext_deleted_terms x USING old_rows o WHERE x.knowledge_base_id = o.knowledge_base_id;
    DELETE FROM fulltext_docs x USING old_rows o WHERE x.knowledge_base_id = o.knowledge_base_id;
    DELETE FROM fulltext_blocks x USING old_rows o WHERE x.knowledge_base_id = o.knowledge_base_id;
    DELETE FROM fulltext_dictionary x USING old_rows o WHERE x.knowledge_base_id = o.knowledge_base_id;
    DELETE FROM fulltext_prefixes x USING old_rows o WHERE x.knowledge_base_id = o.knowledge_base_id;
    DELETE FROM fulltext_segments x USING old_rows o WHERE x.knowledge_base_id = o.knowledge_base_id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER fulltext_kb_stats_dropped AFTER DELETE ON fulltext_kb_stats
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION fulltext_kb_stats_dropped();
