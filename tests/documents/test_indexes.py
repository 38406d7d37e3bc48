"""索引的形状：文档相关的表上没有重复的 b-tree 索引（每个索引都要在每次写入时维护，百万行的分块表上还占几十 MB）；
全文统计的主键覆盖打分要读的列。"""

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


def test_term_statistics_primary_key_covers_df() -> None:
    # 前缀词的 df 是主键上一段范围的 df 之和：主键带上 df，这段求和才是仅索引扫描
    # （见 search/sql/fulltext_storage.v1.sql）
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT i.indnkeyatts, array_agg(a.attname ORDER BY k.ord)
            FROM pg_index i JOIN unnest(i.indkey) WITH ORDINALITY k(attnum, ord) ON true
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
            WHERE i.indrelid = 'fulltext_term_stats'::regclass AND i.indisprimary
            GROUP BY i.indnkeyatts
        """)
        assert cursor.fetchall() == [(2, ["knowledge_base_id", "lexeme", "df"])]
