-- document_chunks 上的语句级触发器（v1）：任何让分块出现、消失或改变的语句都在同一个事务里更新 BM25 统计与倒排。
--
-- 这是“统计永远精确”的保证：摄取的 COPY、ORM 删除、清理任务的批量 DELETE、rebuild_fulltext 的 UPDATE、
-- 后台直接删行——分块可见的那一刻统计也可见，不需要定时任务。语句级 + 过渡表：一次 COPY 几千个分块
-- 只调用一次 fulltext_stats_apply（几条聚合语句），而不是每行一次。
-- 只统计可检索的分块：父块（role = 'parent'）只用来回填上下文，不参与检索。
-- UPDATE 把旧行记为 -1、新行记为 +1：改了 tsvector 的分块先撤掉旧倒排再写新的，没改的分块净增量为 0。
--
-- 本文件已随迁移 search.0001_squashed_0005_fulltext_engine 发布，迁移里记着它的 SHA-256，不要再改：
-- 新版本写成 fulltext_stats_maintain.v2.sql（完整的 CREATE OR REPLACE），由一个新迁移应用（见 search/fulltext.py）。
CREATE OR REPLACE FUNCTION fulltext_stats_maintain() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- 过渡表只在对应事件里存在；PL/pgSQL 的语句在第一次执行时才规划，没走到的分支不会引用不存在的表
    IF TG_OP = 'INSERT' THEN
        PERFORM fulltext_stats_apply(ARRAY(
            SELECT ROW(knowledge_base_id, id, search_vector, search_length, 1)::fulltext_chunk_delta
            FROM new_rows WHERE role <> 'parent'));
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM fulltext_stats_apply(ARRAY(
            SELECT ROW(knowledge_base_id, id, search_vector, search_length, -1)::fulltext_chunk_delta
            FROM old_rows WHERE role <> 'parent'));
    ELSE
        PERFORM fulltext_stats_apply(ARRAY(
            SELECT ROW(knowledge_base_id, id, search_vector, search_length, -1)::fulltext_chunk_delta
            FROM old_rows WHERE role <> 'parent'
            UNION ALL
            SELECT ROW(knowledge_base_id, id, search_vector, search_length, 1)::fulltext_chunk_delta
            FROM new_rows WHERE role <> 'parent'));
    END IF;
    RETURN NULL;
END
$$;

-- 三种事件各一个触发器：过渡表的声明（NEW TABLE / OLD TABLE）随事件不同，一个触发器声明不了全部
CREATE OR REPLACE TRIGGER document_chunks_fulltext_stats_insert AFTER INSERT ON document_chunks
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION fulltext_stats_maintain();
CREATE OR REPLACE TRIGGER document_chunks_fulltext_stats_delete AFTER DELETE ON document_chunks
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION fulltext_stats_maintain();
CREATE OR REPLACE TRIGGER document_chunks_fulltext_stats_update AFTER UPDATE ON document_chunks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION fulltext_stats_maintain();
