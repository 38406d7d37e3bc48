-- 全文存储 v8（在 v7 之上，只写变更）：序号表与删除集带上分块的正排（terms）。
--
-- 分块的词位以前只存在 document_chunks.search_vector（tsvector 的文本，10 万块的库每块 2.1 KB，全文数据里最大的
-- 一项）。v8 起合并把每个分块的正排——词位与标题 / 正文词频，不带位置，zlib 压缩（raglib/forward.py，约 0.8 KB）——
-- 写在它的序号表行里；分块被删时触发器把这一行连正排搬进删除集，df 据此减掉（以前从 search_vector 取词位）。
-- L0 里的分块不需要正排：L0 的行本身就是。
--
-- 这一版只加列：已有的行由迁移 search.0016 从分块的 search_vector 回填，之后 v9 才加上 NOT NULL、去掉删除集的词位数组。
--
-- 本文件已随迁移 search.0016_fulltext_forward_index 发布，迁移里记着它的 SHA-256，不要再改：
-- 存储的下一次变更写成 fulltext_storage.v9.sql，由一个新迁移应用（见 search/fulltext.py）。
ALTER TABLE fulltext_docs ADD COLUMN terms bytea;
ALTER TABLE fulltext_deleted ADD COLUMN terms bytea;
