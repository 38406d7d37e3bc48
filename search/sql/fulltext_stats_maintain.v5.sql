-- document_chunks 上的语句级触发器（v5）：任何让分块出现、消失或改变的语句都在同一个事务里记进全文引擎。
-- v5 与 v4 只差函数开头一段：一条 UPDATE 没有改动任何一行的全文输入（知识库、文档、角色、词位、词数）时什么也不做。
-- 以前每条 UPDATE 都按“先删、再插”记进引擎：分块移进向量图（documents.0015 的 ann_pending 改成假，
-- search.ann.flush_pending）只改一列，却要把分块从段里记进删除集、再追加进 L0，合并时换一个序号——全文什么也没变。
-- 带过渡表的触发器不能按列声明（PostgreSQL 不允许 UPDATE OF 列 与 REFERENCING 同用），所以在函数里比较新旧行。
-- 判断按整条语句：只要有一行改了全文输入（或 id 对不上），整条语句照 v4 的做法处理全部行，结果与 v4 相同。
--
-- v4 起分块的词位存 tsvector 的文本形式（documents.0013，见那里的说明——PostgreSQL 的 pglz 压得动文本形式，
-- 压不动二进制的 tsvector），这里读它时转回 tsvector。
--
-- v2 的写入只追加，不更新任何共享的行（v1 每条写入都要更新知识库统计行与每个词位的 df 行，同一知识库的
-- 并发写入在那一行上排队，一个分块还要在倒排的 B 树里随机插入两百多行）：
-- * 新分块：fulltext_l0 里追加一行（所属文档、词位数组 + 标题/正文词频数组，由 fulltext_chunk_terms 从 tsvector 取出）；
-- * 删掉的分块：还在 L0 的直接删掉那一行；已合并进段的，从 fulltext_docs 移到 fulltext_deleted
--   （倒排留在段里，查询时按序号过滤，段被合并时清掉），带上它的词位，df 据此减掉它；
-- * UPDATE（重新索引）= 先按旧行删、再按新行插：分块换新的词，合并时得到新的序号。
-- N、总词数、df 在查询时按“段 + L0 − 删除集”算出（search.bm25），分块可见的那一刻统计也可见。
--
-- 只记可检索的分块（role <> 'parent'）。知识库没有统计行（fulltext_kb_stats）时删除整条跳过：整库清理先用
-- search.segments.drop 删掉统计行与全部全文数据，之后逐批删分块不必逐个查找；新知识库的第一批分块建起统计行。
--
-- 与合并并发：合并（search.segments.compact）用 DELETE ... RETURNING 取走 L0 的行并锁住它们。删除一个正在被合并
-- 的分块时，第 1 条语句等合并提交、发现那一行已经不在；第 2 条语句在新的快照里看得到合并刚写入的 fulltext_docs，
-- 于是把它记进删除集。两条语句因此不能并成一条（一条语句只有一个快照）。
--
-- 本文件已随迁移 search.0014_fulltext_update_skips_unchanged 发布，迁移里记着它的 SHA-256，不要再改：
-- 新版本写成 fulltext_stats_maintain.v6.sql（完整的 CREATE OR REPLACE），由一个新迁移应用（见 search/fulltext.py）。
CREATE OR REPLACE FUNCTION fulltext_stats_maintain() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- 过渡表只在对应事件里存在；PL/pgSQL 的语句在第一次执行时才规划，没走到的分支不会引用不存在的表
    -- 全文输入一行也没变的 UPDATE（只改了 ann_pending 之类的列）：引擎里没有要改的。比较词位要解压两边的文本，
    -- 每行几十微秒，比把整条语句当重新索引（删除集 + L0 + 下次合并）便宜得多
    -- （两层 IF：一个条件表达式是一条查询，整条规划，INSERT 时 old_rows 不存在）
    IF TG_OP = 'UPDATE' THEN
        IF NOT EXISTS (
            SELECT 1 FROM old_rows o LEFT JOIN new_rows n ON n.id = o.id
            WHERE n.id IS NULL
               OR (o.knowledge_base_id, o.document_id, o.role, o.search_length, o.search_vector)
                  IS DISTINCT FROM (n.knowledge_base_id, n.document_id, n.role, n.search_length, n.search_vector)) THEN
            RETURN NULL;
        END IF;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM fulltext_l0 l USING old_rows o
        WHERE o.role <> 'parent' AND l.knowledge_base_id = o.knowledge_base_id AND l.chunk_id = o.id
          AND EXISTS (SELECT 1 FROM fulltext_kb_stats s WHERE s.knowledge_base_id = o.knowledge_base_id);
        WITH gone AS (
            DELETE FROM fulltext_docs d USING old_rows o
            WHERE o.role <> 'parent' AND d.knowledge_base_id = o.knowledge_base_id AND d.chunk_id = o.id
              AND EXISTS (SELECT 1 FROM fulltext_kb_stats s WHERE s.knowledge_base_id = o.knowledge_base_id)
            RETURNING d.knowledge_base_id, d.ordinal, d.length, o.search_vector)
        INSERT INTO fulltext_deleted (knowledge_base_id, ordinal, length, lexemes)
        SELECT knowledge_base_id, ordinal, length, coalesce(tsvector_to_array(search_vector::tsvector), '{}')
        FROM gone;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        -- 新知识库的统计行（全零，由合并填写）。先看一眼再插：写入不去碰已有的这一行，不与合并排队
        INSERT INTO fulltext_kb_stats (knowledge_base_id, chunk_count, total_length, next_ordinal, next_segment)
        SELECT DISTINCT n.knowledge_base_id, 0, 0, 0, 0 FROM new_rows n
        WHERE n.role <> 'parent'
          AND NOT EXISTS (SELECT 1 FROM fulltext_kb_stats s WHERE s.knowledge_base_id = n.knowledge_base_id)
        ON CONFLICT DO NOTHING;
        -- 空的 tsvector 也占一行：它照样计入分块数 N（词数为 0）
        INSERT INTO fulltext_l0 (knowledge_base_id, chunk_id, document_id, length, lexemes, title_tf, body_tf)
        SELECT n.knowledge_base_id, n.id, n.document_id, coalesce(n.search_length, 0), t.lexemes, t.title_tf, t.body_tf
        FROM new_rows n CROSS JOIN LATERAL fulltext_chunk_terms(n.search_vector::tsvector) t
        WHERE n.role <> 'parent';
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
