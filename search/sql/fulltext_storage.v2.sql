-- 全文引擎的存储（v2）：压缩的块倒排 + 写入用的 L0，取代 v1 每个 (词位, 分块) 一行的倒排表。
--
-- v1 的倒排一行约 150 字节（元组头、UUID、词位、主键索引），一个分块约 280 行，每分块约 30 KB；写一个分块要在
-- B 树里随机插入两百多行，吞吐卡在每秒一百个分块上下。v2 照 Lucene 的做法：
--
-- * 写入只追加：新分块在 fulltext_l0 里占一行（词位数组 + 两个词频数组），没有按词位的随机插入，也不更新任何
--   “知识库一行”的热点行。已合并的分块被删时在 fulltext_deleted 里记一行（查询时过滤）。
-- * 后台合并（search.segments.compact）把 L0 编成一个不可变的“段”：按词位排好序的词典块（fulltext_dictionary，
--   约 64 个词一行，罕见词的倒排直接内联在词典里）与常见词的倒排块（fulltext_blocks，≤128 个倒排一行，
--   分块序号差分编码，词频与长度各压成一个字节）。段多了再并成大段，合并时清掉已删除的分块。
-- * 统计不单独维护：N、总词数、df 都是“段里的 + L0 的 − 删除集的”，在查询的同一快照里读出，永远与分块一致。
--
-- 知识库统计行（Django 模型 search.FulltextKbStats，迁移给它加上 next_ordinal、next_segment 两列）从此只由
-- 合并写：chunk_count、total_length 是段里的分块数与词数（含删除集里的），写入分块不再碰这一行。
--
-- 块与词典块的字节格式见 raglib/postings.py、raglib/lexicon.py。每张表都以 knowledge_base_id 开头：
-- 按知识库分区或用 Citus 按知识库分布时，一个知识库的行落在一起（docs/DEPLOYMENT.md）。
--
-- 本文件已随迁移 search.0008_fulltext_segments 发布，迁移里记着它的 SHA-256，不要再改：
-- 存储的变更写成新文件 fulltext_storage.v3.sql（只写变更），由一个新迁移应用（见 search/fulltext.py）。

-- v1 的倒排与它的行类型。触发器与函数由各自文件的 v2 先删掉或换掉；词统计表 fulltext_term_stats 是
-- Django 模型，由迁移的 DeleteModel 删除
DROP TABLE fulltext_postings;
DROP TYPE fulltext_chunk_delta;

-- 还没合并进段的分块，一个分块一行：词位与标题/正文词频（三个数组一一对应），length 是分块词数。
-- 查询按 GIN 索引找含查询词的行；合并把它们整批取走。正常时每个知识库只有几百到几千行
CREATE TABLE fulltext_l0 (
    knowledge_base_id uuid NOT NULL,
    chunk_id bigint NOT NULL,
    length integer NOT NULL,
    lexemes text[] COLLATE "C" NOT NULL,
    title_tf smallint[] NOT NULL,
    body_tf smallint[] NOT NULL,
    PRIMARY KEY (knowledge_base_id, chunk_id)
);
CREATE INDEX fulltext_l0_lexemes ON fulltext_l0 USING gin (lexemes);

-- 已合并的分块：知识库内稠密的 int4 序号 ↔ 分块 id 与词数。倒排里存的是序号（差分后一两个字节），
-- 不是 8 字节的分块 id。序号在合并时按顺序分配，一个段是一段连续的序号，所以这里不必记段号。
-- 被删的分块从这里移到 fulltext_deleted
CREATE TABLE fulltext_docs (
    knowledge_base_id uuid NOT NULL,
    ordinal integer NOT NULL,
    chunk_id bigint NOT NULL,
    length integer NOT NULL,
    PRIMARY KEY (knowledge_base_id, ordinal)
);
CREATE UNIQUE INDEX fulltext_docs_chunk ON fulltext_docs (knowledge_base_id, chunk_id);

-- 已合并、随后被删（或被重新索引）的分块：它的倒排还在段里，查询时按序号过滤；lexemes 用来从 df 里减掉它。
-- 它所在的段（序号落在段的范围里）下一次被合并时倒排被清掉，这一行随之删除。
-- folded：合并任务已把它的词位计进 fulltext_deleted_terms。查询只对还没折叠的（最近一两分钟的删除）逐行数词，
-- 折叠过的查那张按词的表：删除集攒到上万行（大库里删掉一成文档）时，查询不必把每个被删分块的词位都展开
CREATE TABLE fulltext_deleted (
    knowledge_base_id uuid NOT NULL,
    ordinal integer NOT NULL,
    length integer NOT NULL,
    lexemes text[] COLLATE "C" NOT NULL,
    folded boolean NOT NULL DEFAULT false,
    PRIMARY KEY (knowledge_base_id, ordinal)
);
CREATE INDEX fulltext_deleted_unfolded ON fulltext_deleted USING gin (lexemes) WHERE NOT folded;

-- 删除集里已折叠的分块按词计数：df 的修正一个词一次主键查找。只由合并任务写（每个知识库一次一个），
-- 不是写入路径上的热点行；段被合并、删除集清除时减回去
CREATE TABLE fulltext_deleted_terms (
    knowledge_base_id uuid NOT NULL,
    lexeme text COLLATE "C" NOT NULL,
    count integer NOT NULL,
    PRIMARY KEY (knowledge_base_id, lexeme)
);

-- 段：一次合并写出的不可变倒排，覆盖序号 [first_ordinal, end_ordinal)。只合并相邻的段，范围因此总是连续的，
-- 清除删除集时按序号范围就知道哪些属于被合并的段。doc_count 含其中已删除的分块（合并时才清掉）
CREATE TABLE fulltext_segments (
    knowledge_base_id uuid NOT NULL,
    segment_id integer NOT NULL,
    first_ordinal integer NOT NULL,
    end_ordinal integer NOT NULL,
    doc_count integer NOT NULL,
    PRIMARY KEY (knowledge_base_id, segment_id)
);

-- 段的词典：按词位（"C" 排序）切成块，一行存约 64 个连续的词位、各自在段内的 df 与倒排（罕见词内联）。
-- 找一个词 = 取 first_lexeme ≤ 它的最后一行；前缀词 = 一段连续的行。罕见词占词位的大半，内联省掉了每词一行的开销
CREATE TABLE fulltext_dictionary (
    knowledge_base_id uuid NOT NULL,
    segment_id integer NOT NULL,
    first_lexeme text COLLATE "C" NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (knowledge_base_id, segment_id, first_lexeme)
);

-- 常见词（段内 df 超过内联上限）的倒排块：块号 0 存影响力最高的 ≤128 个倒排，往后依次递减，
-- 常见词只读前几块（读取额度见 raglib.bm25.allot_postings）
CREATE TABLE fulltext_blocks (
    knowledge_base_id uuid NOT NULL,
    segment_id integer NOT NULL,
    lexeme text COLLATE "C" NOT NULL,
    block_no integer NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (knowledge_base_id, segment_id, lexeme, block_no)
);
