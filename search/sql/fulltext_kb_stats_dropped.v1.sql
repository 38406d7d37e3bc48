-- 知识库统计行被删时，把这个知识库剩下的倒排一并删掉（v1）。
--
-- 规则是“没有统计行的知识库没有倒排”：fulltext_stats_apply 只为有统计行的知识库维护词统计与倒排。
-- 整库清理先删掉统计与倒排（search.bm25.statistics_drop），之后逐批删分块时触发器整条跳过这个库：
-- 以前清理经触发器逐行删倒排，删 1,000 个分块（约 28 万行倒排）约 8 s，1M 分块的库要按小时计。
-- 不论统计行是 statistics_drop、ORM 级联删库（统计行可能先于分块被删）还是手工删掉的，
-- 这个触发器都保证跳过的那些删除不会留下孤儿倒排。
--
-- 本文件已随迁移 search.0001_squashed_0005_fulltext_engine 发布，迁移里记着它的 SHA-256，不要再改：
-- 新版本写成 fulltext_kb_stats_dropped.v2.sql，由一个新迁移应用（见 search/fulltext.py）。
CREATE OR REPLACE FUNCTION fulltext_kb_stats_dropped() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM fulltext_postings p USING old_rows o WHERE p.knowledge_base_id = o.knowledge_base_id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER fulltext_kb_stats_dropped AFTER DELETE ON fulltext_kb_stats
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION fulltext_kb_stats_dropped();
