-- 全文存储 v5（在 v4 之上，只写变更）：每个段一个全局唯一的代号 generation。
--
-- 段一经写出就不再修改（合并写新段、删旧段），检索进程因此可以把段的词典块留在内存里（search.segment_cache），
-- 省下每个查询在每个段里查词典的那条 SQL。缓存的键不能是 (知识库, segment_id)：整库重建（segments.rebuild）
-- 从 0 重新编段号，同一个段号换了内容。代号取自一个全局序列，回滚、重建都不会重复用到。
-- 已有的段各得一个新值（加列时按行求默认值；段表每个知识库只有几行）。
--
-- 本文件已随迁移 search.0011_fulltext_segment_generation 发布，迁移里记着它的 SHA-256，不要再改：
-- 存储的下一次变更写成 fulltext_storage.v6.sql，由一个新迁移应用（见 search/fulltext.py）。
CREATE SEQUENCE fulltext_segment_generation;
ALTER TABLE fulltext_segments ADD COLUMN generation bigint NOT NULL DEFAULT nextval('fulltext_segment_generation');
