-- document_chunks 上的全文触发器（v6）：分块的词位不再存在分块行里。
--
-- search_vector 成了“过渡列”：写入分块的语句（摄取的 COPY、INSERT）与重新索引的语句（UPDATE ... SET search_vector）
-- 照旧给出 tsvector 的文本，BEFORE ROW 触发器把它写成 fulltext_l0 的一行（词位数组 + 标题 / 正文词频，
-- fulltext_chunk_terms），再把这一列置成 NULL 存下去——读分块行时它总是 NULL。合并把 L0 的行编进段，
-- 同时把分块的正排（不带位置、zlib 压缩，raglib/forward.py）写进序号表 fulltext_docs.terms。以前这一列
-- （10 万块的库每块 2.1 KB）是分块的正排：删除时从它取词位、短语查询回表时 @@ 检查它；现在前者取序号表的正排，
-- 后者对候选的原文重新切词（search/bm25.py）。
--
-- 行级触发器而不是 v5 的语句级：置 NULL 只能在 BEFORE ROW 里做（AFTER 里再 UPDATE 一遍要多写一份分块行）。
-- 开销量过，写 L0 再置 NULL 与语句级的写法相当（bench/pages/fulltext_engine.md 的“插入一侧”）。
--
-- * 新分块（INSERT）：知识库没有统计行就建一行（全零，由合并填写；先看一眼再插，写入不去碰已有的这一行），
--   再在 L0 里追加一行。没有词的分块（search_vector 为 NULL 或空）也占一行：它照样计入分块数 N（词数为 0）。
-- * 重新索引（UPDATE 给出了 search_vector）：先按旧行撤出引擎（fulltext_forget），再按新行追加进 L0；
--   合并时它得到新的序号。
-- * 别的 UPDATE：只改了与全文无关的列（ann_pending 之类）时触发器不运行（WHEN 条件，连函数都不调用）；改了
--   知识库、文档、角色或词数却没给 search_vector 的，报错：引擎不存分块的 tsvector，没法按新行重新登记它。
-- * 删除（语句级）：还在 L0 的直接删掉那一行；已合并进段的，从序号表移到删除集 fulltext_deleted，带着它的正排
--   （倒排留在段里，查询时按序号过滤，段被合并时清掉），df 据此减掉。
--
-- 只记可检索的分块（role <> 'parent'）。知识库没有统计行（fulltext_kb_stats）时撤出整条跳过：整库清理先用
-- search.segments.drop 删掉统计行与全部全文数据，之后逐批删分块不必逐个查找；新知识库的第一个分块建起统计行。
--
-- 与合并并发：合并（search.segments.compact）用 DELETE ... RETURNING 取走 L0 的行并锁住它们。撤出一个正在被合并
-- 的分块时，fulltext_forget 的第 1 条语句等合并提交、发现那一行已经不在；第 2 条语句在新的快照里看得到合并刚写入
-- 的 fulltext_docs，于是把它记进删除集。两条语句因此不能并成一条（一条语句只有一个快照；SQL 函数的每条语句各取快照）。
--
-- 本文件已随迁移 search.0016_fulltext_forward_index 发布，迁移里记着它的 SHA-256，不要再改：
-- 新版本写成 fulltext_stats_maintain.v7.sql（完整的 CREATE OR REPLACE），由一个新迁移应用（见 search/fulltext.py）。
DROP TRIGGER IF EXISTS document_chunks_fulltext_stats_insert ON document_chunks;
DROP TRIGGER IF EXISTS document_chunks_fulltext_stats_update ON document_chunks;
DROP TRIGGER IF EXISTS document_chunks_fulltext_stats_delete ON document_chunks;
DROP FUNCTION IF EXISTS fulltext_stats_maintain();

-- 把这些分块（可检索的，按知识库）撤出引擎：L0 的行删掉，已合并的连正排移进删除集
CREATE OR REPLACE FUNCTION fulltext_forget(kbs uuid[], chunks bigint[]) RETURNS void LANGUAGE sql AS $$
    DELETE FROM fulltext_l0 l USING unnest(kbs, chunks) AS o(kb, id)
    WHERE l.knowledge_base_id = o.kb AND l.chunk_id = o.id
      AND EXISTS (SELECT 1 FROM fulltext_kb_stats s WHERE s.knowledge_base_id = o.kb);
    WITH gone AS (
        DELETE FROM fulltext_docs d USING unnest(kbs, chunks) AS o(kb, id)
        WHERE d.knowledge_base_id = o.kb AND d.chunk_id = o.id
          AND EXISTS (SELECT 1 FROM fulltext_kb_stats s WHERE s.knowledge_base_id = o.kb)
        RETURNING d.knowledge_base_id, d.ordinal, d.length, d.terms)
    INSERT INTO fulltext_deleted (knowledge_base_id, ordinal, length, terms)
    SELECT knowledge_base_id, ordinal, length, terms FROM gone;
$$;

CREATE OR REPLACE FUNCTION fulltext_chunk_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.search_vector IS NULL THEN
            RAISE EXCEPTION 'document_chunks %: changing knowledge_base_id, document_id, role or search_length'
                ' needs search_vector as well (the full-text engine does not keep the chunk''s tsvector)', OLD.id
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF OLD.role <> 'parent' THEN
            PERFORM fulltext_forget(ARRAY[OLD.knowledge_base_id], ARRAY[OLD.id]);
        END IF;
    END IF;
    IF NEW.role <> 'parent' THEN
        IF NOT EXISTS (SELECT 1 FROM fulltext_kb_stats s WHERE s.knowledge_base_id = NEW.knowledge_base_id) THEN
            INSERT INTO fulltext_kb_stats (knowledge_base_id, chunk_count, total_length, next_ordinal, next_segment)
            VALUES (NEW.knowledge_base_id, 0, 0, 0, 0) ON CONFLICT DO NOTHING;
        END IF;
        INSERT INTO fulltext_l0 (knowledge_base_id, chunk_id, document_id, length, lexemes, title_tf, body_tf)
        SELECT NEW.knowledge_base_id, NEW.id, NEW.document_id, coalesce(NEW.search_length, 0), t.lexemes, t.title_tf,
               t.body_tf
        FROM fulltext_chunk_terms(NEW.search_vector::tsvector) t;
    END IF;
    NEW.search_vector := NULL;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION fulltext_chunks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM fulltext_forget(array_agg(o.knowledge_base_id), array_agg(o.id)) FROM old_rows o WHERE o.role <> 'parent';
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER document_chunks_fulltext_insert BEFORE INSERT ON document_chunks
    FOR EACH ROW EXECUTE FUNCTION fulltext_chunk_written();
CREATE OR REPLACE TRIGGER document_chunks_fulltext_update BEFORE UPDATE ON document_chunks
    FOR EACH ROW WHEN (NEW.search_vector IS NOT NULL
                       OR (NEW.knowledge_base_id, NEW.document_id, NEW.role, NEW.search_length)
                          IS DISTINCT FROM (OLD.knowledge_base_id, OLD.document_id, OLD.role, OLD.search_length))
    EXECUTE FUNCTION fulltext_chunk_written();
CREATE OR REPLACE TRIGGER document_chunks_fulltext_delete AFTER DELETE ON document_chunks
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION fulltext_chunks_deleted();
