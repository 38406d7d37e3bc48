-- 全文引擎的存储（v1）：倒排表 fulltext_postings、触发器传增量用的行类型 fulltext_chunk_delta、
-- 两张统计表的存储参数与词统计的覆盖主键。
--
-- 统计表 fulltext_kb_stats、fulltext_term_stats 是 Django 模型（search.models），由迁移的 CreateModel 建表，
-- 这里只补上 ORM 表达不了的部分。倒排表没有模型：行的增删全由触发器负责，应用只读它。
--
-- 本文件已随迁移 search.0001_squashed_0005_fulltext_engine 发布，迁移里记着它的 SHA-256，不要再改：
-- 存储的变更写成新文件 fulltext_storage.v2.sql（只写 ALTER），由一个新迁移应用（见 search/fulltext.py）。

-- 触发器把一条语句改动的分块打包成这种行的数组，交给 fulltext_stats_apply 一次处理：
-- sign 为 +1（新行）或 -1（旧行），len 是分块词数（BM25 的文档长度）
CREATE TYPE fulltext_chunk_delta AS (kb uuid, chunk bigint, sv tsvector, len integer, sign integer);

-- 倒排表（知识库, 词位, 影响力, 分块）→ 标题/正文词频与分块词数。BM25 打分是它上面的一条聚合查询：
-- 每个查询词读一段连续的主键范围，不必对候选分块逐个解析 tsvector。
-- 词位用 "C" 排序规则：前缀词（'肝':*）就是一段主键范围，与 fulltext_term_stats 的范围边界按同一顺序比较。
CREATE TABLE fulltext_postings (
    -- 不设外键：行的增删全由触发器跟着分块走（外键还会让测试的 TRUNCATE 失败）
    knowledge_base_id uuid NOT NULL,
    lexeme text COLLATE "C" NOT NULL,
    impact smallint NOT NULL,
    chunk_id bigint NOT NULL,
    title_tf smallint NOT NULL,
    body_tf smallint NOT NULL,
    length integer NOT NULL,
    -- 一个词位的行按影响力（fulltext_impact）连续存放：倒着扫主键就是从贡献最大的读起，LIMIT 截断不用排序。
    -- 打分只读 INCLUDE 的几列，走仅索引扫描不回表
    PRIMARY KEY (knowledge_base_id, lexeme, impact, chunk_id) INCLUDE (title_tf, body_tf, length)
);

-- 按插入量及早清理：仅索引扫描只对 VACUUM 设过可见性映射的页不回表。默认的插入比例 0.2 意味着 1M 分块
-- （约 2.4 亿行倒排）的知识库要再写进约 20% 才清理一次，其间新写入的倒排散在各个词位里，查询读到就逐行回表
-- （bench 量到刚批量写入、未清理时全文路 p50 262 ms / p95 902 ms）。1% 时清理只扫没置位的页，代价与新写入量成正比
ALTER TABLE fulltext_postings SET (autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_vacuum_scale_factor = 0.02);

-- 词统计的主键带上 df（INCLUDE）：前缀词的 df 是以它开头的各词位 df 之和，也就是主键上的一段范围，
-- 主键不含 df 时要逐行回表，而表按写入顺序存放，一段范围散在几千个堆页上（100k 分块的库里 11~16 ms，
-- 带上之后只读二三十个索引页，< 1 ms）。代价：摄取更新词行不再是 HOT 更新。
-- 词行被摄取不停地更新，默认 20% 的死行比例才清理太迟，调成 2%（与倒排表一致）。
-- 已有数据的库上换主键要先 CREATE UNIQUE INDEX CONCURRENTLY 再换约束，不锁检索（当年的迁移 0005 就是这样做的）；
-- 这个文件只在新建的空表上执行，直接换
ALTER TABLE fulltext_term_stats DROP CONSTRAINT fulltext_term_stats_pkey,
    ADD CONSTRAINT fulltext_term_stats_pkey PRIMARY KEY (knowledge_base_id, lexeme) INCLUDE (df);
ALTER TABLE fulltext_term_stats SET (autovacuum_vacuum_scale_factor = 0.02);
