-- 把一条语句的分块增量（fulltext_chunk_delta 数组）记进 BM25 统计与倒排表（v1），由 fulltext_stats_maintain 调用。
--
-- 五条语句，顺序有讲究：
-- 1. 先按净增量 upsert 知识库统计行（分块数、词数之和）。这一行的行锁让同一知识库的并发写入在这里排队，
--    之后按词位顺序（ORDER BY ... COLLATE "C"）更新词行，不会互相死锁；不同知识库互不影响。
--    净减少且统计行已不在时不插入：不凭空造出负数行（ORM 级联删库时统计行可能先于分块被删）。
-- 2. upsert 词统计（df）；3. 删掉 df 降到 0 的词行。
-- 4. 删旧倒排、5. 写新倒排：先删后插，因为 UPDATE 语句里同一个分块既在 old_rows 也在 new_rows。
--    影响力（fulltext_impact）只由分块自身算出，删除时按完整主键定位那一行。
--
-- 2~5 只处理“有统计行”的知识库（各处的 EXISTS (SELECT 1 FROM fulltext_kb_stats ...)）：
-- 统计行不在 = 这个知识库不计统计。整库清理先用 statistics_drop 删掉统计与倒排，之后删分块时这里整条跳过，
-- 不再逐行删倒排；新知识库的第一批分块在第 1 步照常建起统计行，所以照常计数。
-- 清理期间才写入的分块会重新建起统计行，清理结束时 statistics_drop 再清一次（见 fulltext_kb_stats_dropped）。
--
-- 词频取自 tsvector 的位置权重：A 是标题部分（文件名、文档标题、标题路径），其余是正文。用数组函数数次数，
-- 而不是 (SELECT count(*) FROM unnest(...))：每行倒排少一个子查询，1M 分块重建时快好几倍。
--
-- 函数体与已部署的数据库里的函数逐字节相同（当年由几个迁移拼接出来，排版略乱，包括一处行尾空格）：
-- 全新部署与老部署因此得到完全相同的函数。本文件已随迁移 search.0001_squashed_0005_fulltext_engine 发布，
-- 迁移里记着它的 SHA-256，不要再改（也不要让编辑器删掉行尾空格）：新版本写成 fulltext_stats_apply.v2.sql
-- （完整的 CREATE OR REPLACE，可以顺便理顺排版），由一个新迁移应用（见 search/fulltext.py）。
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
    WHERE EXISTS (SELECT 1 FROM fulltext_kb_stats x WHERE x.knowledge_base_id = d.kb)
    GROUP BY d.kb, l.lexeme
    HAVING sum(d.sign) > 0 OR (sum(d.sign) < 0 AND EXISTS (
        SELECT 1 FROM fulltext_term_stats x WHERE x.knowledge_base_id = d.kb AND x.lexeme = l.lexeme))
    ORDER BY d.kb, l.lexeme COLLATE "C"
    ON CONFLICT (knowledge_base_id, lexeme) DO UPDATE SET df = t.df + EXCLUDED.df;
    DELETE FROM fulltext_term_stats t
    USING (SELECT DISTINCT d.kb, l.lexeme FROM unnest(deltas) d, unnest(tsvector_to_array(d.sv)) AS l(lexeme)
           WHERE d.sign < 0 AND EXISTS (SELECT 1 FROM fulltext_kb_stats x WHERE x.knowledge_base_id = d.kb)) g
    WHERE t.knowledge_base_id = g.kb AND t.lexeme = g.lexeme AND t.df <= 0;
    -- 倒排表：先删旧行再插新行（UPDATE 语句里同一分块既在 old_rows 也在 new_rows）。
    -- 影响力由分块自身算出，删除时按完整主键定位
    DELETE FROM fulltext_postings p
    USING (SELECT d.kb, u.lexeme, d.chunk, coalesce(d.len, 0) AS len, 
    coalesce(cardinality(array_positions(u.weights, 'A')), 0) AS title_tf,
    coalesce(cardinality(u.weights) - cardinality(array_positions(u.weights, 'A')), 0) AS body_tf

           FROM unnest(deltas) d, unnest(d.sv) u WHERE d.sign < 0 AND EXISTS (SELECT 1 FROM fulltext_kb_stats x WHERE x.knowledge_base_id = d.kb)) g
    WHERE p.knowledge_base_id = g.kb AND p.lexeme = g.lexeme
      AND p.impact = fulltext_impact(g.title_tf, g.body_tf, g.len) AND p.chunk_id = g.chunk;
    INSERT INTO fulltext_postings (knowledge_base_id, lexeme, impact, chunk_id, title_tf, body_tf, length)
    SELECT g.kb, g.lexeme, fulltext_impact(g.title_tf, g.body_tf, g.len), g.chunk, g.title_tf, g.body_tf, g.len
    FROM (SELECT d.kb, u.lexeme, d.chunk, coalesce(d.len, 0) AS len, 
    coalesce(cardinality(array_positions(u.weights, 'A')), 0) AS title_tf,
    coalesce(cardinality(u.weights) - cardinality(array_positions(u.weights, 'A')), 0) AS body_tf

          FROM unnest(deltas) d, unnest(d.sv) u WHERE d.sign > 0 AND EXISTS (SELECT 1 FROM fulltext_kb_stats x WHERE x.knowledge_base_id = d.kb)) g;
$$;
