-- fulltext_impact 退役（v2）：倒排行的影响力改在合并时由 Python 算（raglib.postings.impacts，同一个公式，
-- 但用存下来的封顶词频与量化长度），只决定段里倒排块的先后，不再是主键的一列。
--
-- 本文件已随迁移 search.0008_fulltext_segments 发布，迁移里记着它的 SHA-256，不要再改。
DROP FUNCTION fulltext_impact(integer, integer, integer);
