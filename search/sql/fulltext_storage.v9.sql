-- 全文存储 v9（在 v8 之上，只写变更）：正排回填完之后，序号表与删除集的正排必有；删除集不再存词位数组。
--
-- 删除集的 lexemes（text[]）与它上面只收未折叠行的 GIN 由 v2 建：查询修正 df、合并折叠时在 SQL 里展开它。
-- 正排在 SQL 里解不开（zlib），这些改由 Python 做（search.bm25、search.segments）；未折叠的行按知识库找，
-- 换成 (knowledge_base_id) 上的部分 B 树索引。
--
-- 本文件已随迁移 search.0016_fulltext_forward_index 发布，迁移里记着它的 SHA-256，不要再改：
-- 存储的下一次变更写成 fulltext_storage.v10.sql，由一个新迁移应用（见 search/fulltext.py）。
ALTER TABLE fulltext_docs ALTER COLUMN terms SET NOT NULL;
ALTER TABLE fulltext_deleted ALTER COLUMN terms SET NOT NULL;
DROP INDEX fulltext_deleted_unfolded;
ALTER TABLE fulltext_deleted DROP COLUMN lexemes;
CREATE INDEX fulltext_deleted_unfolded ON fulltext_deleted (knowledge_base_id) WHERE NOT folded;
