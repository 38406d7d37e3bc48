-- 全文存储 v3（在 v2 之上，只写变更）：每个段按首字汇总的 df。
--
-- 查询里孤立的单字是前缀词（'为':*，见 raglib/analysis.py）：它的 df 是以这个字开头的各词位的 df 之和。v2 为了这个
-- 和要把这些词位所在的词典块全读出来解析——常用字开头的词位有上千个，散在一个段的几十上百个词典块里（100k 分块、
-- 5 个段时 100~220 块、190~380 KB），是全文一路 p95 的大头；而这样的词多半太常见，额度里本来就不读它的倒排。
-- 合并写段时顺手算好（raglib.lexicon.prefix_dfs），查询按主键只查这一个字；要读倒排的前缀词才去取词典块。
-- 与段的其余部分同生同灭：写段、并段、删段、整库删除（fulltext_kb_stats_dropped v3）都带上它。
-- 以 knowledge_base_id 开头，按知识库分区或分布时与同库的其他全文行落在一起。
--
-- 本文件已随迁移 search.0009_fulltext_prefixes 发布，迁移里记着它的 SHA-256，不要再改：
-- 存储的下一次变更写成 fulltext_storage.v4.sql，由一个新迁移应用（见 search/fulltext.py）。
CREATE TABLE fulltext_prefixes (
    knowledge_base_id uuid NOT NULL,
    segment_id integer NOT NULL,
    prefix text COLLATE "C" NOT NULL,
    df integer NOT NULL,
    PRIMARY KEY (knowledge_base_id, segment_id, prefix)
);
