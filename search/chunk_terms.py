"""分块的全文词项从哪里来：按当前的切词设置对分块的原文重新切词。

引擎不存分块的 tsvector（``search/sql/fulltext_stats_maintain.v6.sql``：``search_vector`` 只是写入时的过渡列），
所以要位置或要重新登记时，从分块的原文与元数据重新切：

- 短语查询（含短语算符的 tsquery）回表时检查候选是否满足它（:func:`matching`，``search.bm25``；只看词在不在的
  查询用引擎登记的词项，不到这里）；候选已按分数排好，够数就停，一批几十个，每块 0.2~0.6 ms
  （``bench/pages/fulltext_engine.md``）；
- ``ts_rank_cd`` 排序要位置（:func:`reanalysed`）；
- 改了切词设置之后重新登记全部分块（:func:`reindex_chunks`，``manage.py rebuild_fulltext``），以及整库重建
  （``search.segments.rebuild``）。

切法与标题规则与摄取（``documents.ingestion.build_rows``）相同：同一个 :func:`raglib.analysis.document_terms`，
标题部分由 :func:`raglib.analysis.chunk_titles` 从元数据（文件名、文档标题、标题路径）取。
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import connection

from raglib.analysis import chunk_titles, document_terms

# 按 id 翻页读分块；{scope} 是可选的知识库条件
_CHUNK_PAGE_SQL = ("SELECT c.id, c.chunk_text, c.metadata::text FROM document_chunks c"
                   " WHERE c.id > %s {scope} ORDER BY c.id LIMIT %s")
# 一批分块的新全文输入一条 UPDATE 写回；触发器在同一事务里把它们撤出引擎、按新词项登记进 L0，再把过渡列置空
_WRITE_TERMS_SQL = ("UPDATE document_chunks AS c SET search_vector = v.sv, search_length = v.len"
                    " FROM unnest(%s::bigint[], %s::text[], %s::int[]) AS v(id, sv, len) WHERE c.id = v.id")


def chunk_terms(text: str, metadata: str | None) -> tuple[str, int]:
    """一个分块的 tsvector 字面量（带位置）与词数。``metadata`` 是分块元数据的 JSON 文本。"""
    meta = json.loads(metadata) if metadata else {}
    meta = meta if isinstance(meta, dict) else {}
    titles = chunk_titles(meta.get("filename") or "", meta.get("title"), meta.get("heading_path") or ())
    return document_terms(text, titles, analyzer=settings.FULLTEXT_ANALYZER)


def reanalysed(cursor: Any, chunk_ids: Sequence[int]) -> dict[int, str]:
    """这些分块（还在的）的 tsvector 字面量，重新切词得到。"""
    if not chunk_ids:
        return {}
    cursor.execute("SELECT id, chunk_text, metadata::text FROM document_chunks WHERE id = ANY(%s)", [list(chunk_ids)])
    return {int(chunk_id): chunk_terms(text, metadata)[0] for chunk_id, text, metadata in cursor.fetchall()}


def matching(cursor: Any, chunk_ids: Sequence[int], tsquery: str) -> set[int]:
    """这些分块里满足 tsquery 的（按原文重新切词、带位置，短语的 ``<->`` 照常判断）。"""
    return satisfying(cursor, reanalysed(cursor, chunk_ids), tsquery)


def satisfying(cursor: Any, vectors: dict[int, str], tsquery: str) -> set[int]:
    """分块 id → tsvector 字面量里，满足 tsquery 的那些 id（在 PostgreSQL 里 ``@@``，一条语句）。"""
    if not vectors:
        return set()
    cursor.execute("SELECT v.id FROM unnest(%s::bigint[], %s::text[]) AS v(id, sv) WHERE v.sv::tsvector @@ %s::tsquery",
                   [list(vectors), list(vectors.values()), tsquery])
    return {int(row[0]) for row in cursor.fetchall()}


def reindex_chunks(*, kb_id: uuid.UUID | None = None, batch_size: int = 500) -> int:
    """按当前的切词设置（``RAG_FULLTEXT_ANALYZER``）重新登记分块（分批 UPDATE）。返回处理的行数。

    不重新解析、不重新向量化；触发器在每批的事务里把旧的登记撤出引擎、新的追加进 L0，检索在重算期间照常可用
    （同一知识库里新旧切法的分块会短暂并存，重算完即一致）。
    """
    page_sql = _CHUNK_PAGE_SQL.format(scope="AND c.knowledge_base_id = %s" if kb_id else "")
    scope = [kb_id] if kb_id else []
    last_id, updated = 0, 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(page_sql, [last_id, *scope, batch_size])
            page = cursor.fetchall()
            if not page:
                return updated
            ids = [chunk_id for chunk_id, _, _ in page]
            terms = [chunk_terms(text, metadata) for _, text, metadata in page]
            cursor.execute(_WRITE_TERMS_SQL, [ids, [vector for vector, _ in terms], [length for _, length in terms]])
        updated += len(page)
        last_id = ids[-1]
