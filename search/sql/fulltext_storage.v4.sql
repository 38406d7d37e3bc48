-- 全文存储 v4（在 v3 之上，只写变更）：L0 与序号表记下分块所属的文档。
--
-- 没有元数据过滤的普通查询，回表检查范围只看两件事：分块还在（删除集已在打分时滤掉）、所属文档是 completed。
-- 以前要按序号换分块 id、再按主键读 document_chunks 的行取 document_id：冷缓存时一个候选三四次随机读，
-- 1M 分块的库上这一步占了查询时间的三分之二（bench/pages/fulltext_scale.md，“冷缓存与回表”）。引擎自己记着
-- document_id，这一步只读序号表与（很小的）文档表。分块的文档终身不变（重新摄取是删掉旧分块、写入新分块），
-- 所以这一列不会过期；角色与知识库本来就由触发器保证（只收 role <> 'parent'、按知识库分行）。
--
-- 已有的行由迁移 search.0010 从 document_chunks 回填（这里的默认值只为在已有行上加 NOT NULL 列，随即去掉）。
-- 每块多 16 字节。
--
-- 本文件已随迁移 search.0010_fulltext_document_ids 发布，迁移里记着它的 SHA-256，不要再改：
-- 存储的下一次变更写成 fulltext_storage.v5.sql，由一个新迁移应用（见 search/fulltext.py）。
ALTER TABLE fulltext_l0 ADD COLUMN document_id uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000';
ALTER TABLE fulltext_l0 ALTER COLUMN document_id DROP DEFAULT;
ALTER TABLE fulltext_docs ADD COLUMN document_id uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000';
ALTER TABLE fulltext_docs ALTER COLUMN document_id DROP DEFAULT;
