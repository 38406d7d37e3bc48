"""索引的形状：文档相关的表上没有重复的 b-tree 索引（每个索引都要在每次写入时维护，百万行的分块表上还占几十 MB）；
全文引擎的每张表以知识库开头。"""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

TABLES = ("documents", "document_chunks", "knowledge_domains")


def test_no_btree_index_is_a_prefix_of_another_on_the_same_table() -> None:
    # 索引 a 的列（同样的运算符类）是索引 b 的列的前缀，且 a 既不唯一也不带条件：a 能做的 b 都能做
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT a.indexrelid::regclass::text, b.indexrelid::regclass::text
            FROM pg_index a
            JOIN pg_index b ON b.indrelid = a.indrelid AND b.indexrelid <> a.indexrelid
            JOIN pg_class ac ON ac.oid = a.indexrelid JOIN pg_am aam ON aam.oid = ac.relam
            JOIN pg_class bc ON bc.oid = b.indexrelid JOIN pg_am bam ON bam.oid = bc.relam
            WHERE a.indrelid::regclass::text = ANY(%s) AND aam.amname = 'btree' AND bam.amname = 'btree'
              AND NOT a.indisunique AND a.indpred IS NULL AND b.indpred IS NULL
              AND a.indexprs IS NULL AND b.indexprs IS NULL
              AND (b.indkey::text || ' ') LIKE (a.indkey::text || ' %%')
              AND (b.indclass::text || ' ') LIKE (a.indclass::text || ' %%')
        """, [list(TABLES)])
        duplicates = cursor.fetchall()
    assert duplicates == []


def test_every_fulltext_table_leads_with_the_knowledge_base() -> None:
    # 分区或 Citus 按知识库分布时，一个知识库的全文行落在一起：每张全文表的主键都以 knowledge_base_id 开头
    # （docs/DEPLOYMENT.md；search/sql/fulltext_storage.v2.sql 与 v3）
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT c.relname, a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
            WHERE starts_with(c.relname, 'fulltext_') AND c.relkind = 'r' AND i.indisprimary
        """)
        leading = dict(cursor.fetchall())
    assert len(leading) == 9
    assert set(leading.values()) == {"knowledge_base_id"}
