-- 倒排行的“影响力”（v1）：BM25 的词频饱和项 tfw/(tfw + k1·(1 - b + b·dl/L)) 放大到 smallint，
-- tfw = 2·标题次数 + 正文次数。
--
-- 倒排表的主键第三列就是它：每个词位的行按影响力从高到低连续存放，常见词只读贡献最大的那一段
-- （每个查询词读多少行见 raglib.bm25.allot_postings），稀有词照旧整条读。1M 分块的库里一个常见 bigram
-- 就有几十万行倒排，读前几千行就够排出前几名。读到的行照常按运行时的 IDF、avgdl 与 k1、b 精确计分：
-- 影响力只决定截断时先读谁。
--
-- k1=0.9、b=0.4、L=256 写死，不跟知识库的 avgdl 走：删除分块时触发器必须只凭分块本身算出同一个值，
-- 才能按完整主键找到那一行。所以函数是 IMMUTABLE，改这些常数等于换一种倒排布局（要重建全部倒排）。
--
-- 本文件已随迁移 search.0001_squashed_0005_fulltext_engine 发布，迁移里记着它的 SHA-256，不要再改：
-- 新版本写成 fulltext_impact.v2.sql，由一个新迁移应用（见 search/fulltext.py）。
CREATE OR REPLACE FUNCTION fulltext_impact(title_tf integer, body_tf integer, len integer) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT floor(32767 * tfw / (tfw + 0.9 * (0.6 + 0.4 * greatest(len, 0) / 256.0)))::smallint
    FROM (SELECT 2.0 * title_tf + body_tf AS tfw) x
$$;
