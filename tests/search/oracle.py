"""测试的对照：分块不存 tsvector（search.0016 起），要“分块满足某个 tsquery 吗”“分块的词项是什么”，按原文重新切词
（与摄取同一个切法，:func:`search.chunk_terms.reanalysed`），在 PostgreSQL 里对字面量求值。"""

from __future__ import annotations

import uuid

from django.db import connection

from raglib import forward
from search.chunk_terms import reanalysed


def chunk_vectors(kb_id: uuid.UUID) -> dict[int, str]:
    """知识库里每个可检索分块的 tsvector 字面量（带位置）。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM document_chunks WHERE knowledge_base_id = %s AND role <> 'parent'", [kb_id])
        return reanalysed(cursor, [int(row[0]) for row in cursor.fetchall()])


def matching_chunks(kb_id: uuid.UUID, tsquery: str) -> set[int]:
    """知识库里满足 tsquery 的可检索分块。"""
    vectors = chunk_vectors(kb_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT v.id FROM unnest(%s::bigint[], %s::text[]) AS v(id, sv) WHERE v.sv::tsvector @@ %s",
                       [list(vectors), list(vectors.values()), tsquery])
        return {int(row[0]) for row in cursor.fetchall()}


def analysed_terms(kb_id: uuid.UUID) -> dict[int, forward.ForwardTerms]:
    """每个可检索分块按原文重新切出的词项（与触发器写 L0 同一个 ``fulltext_chunk_terms``，词频截到一个字节）。"""
    vectors = chunk_vectors(kb_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT v.id, t.lexemes, t.title_tf, t.body_tf FROM unnest(%s::bigint[], %s::text[])"
                       " AS v(id, sv) CROSS JOIN LATERAL fulltext_chunk_terms(v.sv::tsvector) t",
                       [list(vectors), list(vectors.values())])
        return {int(row[0]): forward.ForwardTerms.from_columns(*row[1:]) for row in cursor.fetchall()}


def engine_terms(kb_id: uuid.UUID) -> dict[int, forward.ForwardTerms]:
    """引擎登记的每个分块的词项：还在 L0 的取 L0 的行，已合并的解码序号表里的正排。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT chunk_id, terms, NULL, NULL, NULL FROM fulltext_docs WHERE knowledge_base_id = %s"
                       " UNION ALL SELECT chunk_id, NULL, lexemes, title_tf, body_tf FROM fulltext_l0"
                       " WHERE knowledge_base_id = %s", [kb_id, kb_id])
        return {int(chunk_id): forward.decode(bytes(data)) if data is not None
                else forward.ForwardTerms.from_columns(lexemes, titles, bodies)
                for chunk_id, data, lexemes, titles, bodies in cursor.fetchall()}
