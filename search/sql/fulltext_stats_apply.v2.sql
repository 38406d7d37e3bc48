-- fulltext_stats_apply 退役（v2）：它把每条写入的增量记进知识库统计行、词统计与每个 (词位, 分块) 一行的倒排，
-- v2 的写入只往 fulltext_l0 追加一行（search/sql/fulltext_stats_maintain.v2.sql），统计在查询时算出。
--
-- 本文件已随迁移 search.0008_fulltext_segments 发布，迁移里记着它的 SHA-256，不要再改。
DROP FUNCTION fulltext_stats_apply(fulltext_chunk_delta[]);
