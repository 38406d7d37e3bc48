"""两路召回的 SQL：pgvector 余弦距离与全文检索（经 :class:`search.fulltext.FulltextEngine`），以及命中分块的详情读取。

两路共用同一个检索范围（:func:`_scope_sql`）：指定知识库、``completed`` 文档、可检索角色（普通块与子块，
父块只用来回填上下文）、以及调用方的元数据过滤条件。全文一路把它作为 :class:`search.fulltext.ChunkScope`
交给引擎（:func:`fulltext_engine`）。
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.conf import settings

from documents.filters import SearchFilters
from documents.models import INDEX_STATE_SQL, Document
from infra.routers import fetchall_prepared, search_connection
from knowledge.models import SUPPORTED_DIMENSIONS, KnowledgeBase
from raglib.analysis import ParsedQuery
from search import ann
from search.bm25 import PostgresFulltextEngine
from search.fulltext import Bm25Statistics, ChunkScope, FulltextEngine, FulltextHits, PathHit

# 全文一路的引擎。换引擎（pg_search、pg_textsearch 等）见 search.fulltext 的说明：实现接口，在这里按设置选择
_FULLTEXT_ENGINE: FulltextEngine = PostgresFulltextEngine()


def fulltext_engine() -> FulltextEngine:
    """全文一路所用的引擎（检索、补分数、rebuild_fulltext 都经过它）。"""
    return _FULLTEXT_ENGINE


@dataclass
class ChunkRow:
    """返回给调用方所需的分块详情。"""

    chunk_id: int
    document_id: uuid.UUID
    chunk_index: int
    text: str
    filename: str
    metadata: dict[str, Any]
    role: str
    parent_id: int | None
    document_created: Any = None
    # 到查询向量的余弦距离：只在 load_chunks 给了查询向量时有
    distance: float | None = None


def _documents_sql(kb: KnowledgeBase) -> tuple[str, list[Any]]:
    """检索范围里的文档：对 ``documents d`` 的条件（知识库内、completed）与参数。"""
    return "d.knowledge_base_id = %s AND d.status = %s", [kb.id, Document.Status.COMPLETED]


def _scope_sql(kb: KnowledgeBase, filters: SearchFilters) -> tuple[str, list[Any]]:
    """检索范围：知识库内、completed 文档的普通块与子块。文档状态用半连接判断，便于规划器走向量/GIN 索引。"""
    extra, params = filters.sql()
    documents, document_params = _documents_sql(kb)
    sql = (f"c.knowledge_base_id = %s AND c.role <> 'parent'"
           f" AND c.document_id IN (SELECT d.id FROM documents d WHERE {documents})" + extra)
    return sql, [kb.id, *document_params, *params]


@dataclass(frozen=True)
class SearchPlan:
    """检索开始时在检索连接上读到的知识库状况：可检索分块数的估计（completed 文档的 chunk_count 之和，含父块），
    它自己的 ANN 索引在这个库上的状态（没有为 None），以及它有没有不在共享索引里的分块（``detached``，
    见 ``documents.models.DocumentChunk.shared_ann``）。"""

    estimate: int
    index: ann.KbIndex | None
    detached: bool = False

    @property
    def exact(self) -> bool:
        """小知识库精确扫描（召回 100%）。知识库有不在共享索引里的分块、自己的索引却不可用（缩小后删掉了、
        换图时删旧图与改名之间）时也精确扫描：共享索引找不到那些分块。"""
        own_index = self.index is not None and self.index.valid
        return self.estimate <= settings.EXACT_SEARCH_MAX_CHUNKS or (self.detached and not own_index)


def search_plan(kb: KnowledgeBase) -> SearchPlan:
    """一条查询读出 :class:`SearchPlan`（每个检索请求一次往返：分块数读文档表，索引状态查系统目录，有没有不在共享
    索引里的分块探查一次部分索引 ``document_chunks_detached_idx``，都是几十微秒）。语句预备好：它的规划比执行贵。

    都在 ``search_connection()`` 上读：向量查询在哪个库上执行，就看哪个库上的索引与分块。
    """
    [row] = fetchall_prepared(
        search_connection(),
        "SELECT (SELECT coalesce(sum(chunk_count), 0) FROM documents WHERE knowledge_base_id = %s::uuid"
        " AND status = %s::text), s.valid, s.opcname, s.definition,"
        " EXISTS (SELECT 1 FROM document_chunks WHERE knowledge_base_id = %s::uuid AND NOT shared_ann)"
        f" FROM (SELECT 1) one LEFT JOIN LATERAL ({INDEX_STATE_SQL}) s ON true",
        [kb.id, Document.Status.COMPLETED, kb.id, ann.kb_index_name(kb.id)],
    )
    return SearchPlan(int(row[0]), ann.kb_index_from_row(kb.id, row[1:4]), bool(row[4]))


def vector_search(kb: KnowledgeBase, query_vector: np.ndarray, filters: SearchFilters, limit: int,
                  *, exact: bool | None = None, exclude: str = "",
                  plan: SearchPlan | None = None) -> tuple[list[PathHit], str]:
    """按余弦距离升序取前 ``limit`` 个分块，返回 (命中, 所用方法，见 :func:`search.ann.ann_search`)。

    小知识库（≤ RAG_EXACT_SEARCH_MAX_CHUNKS）精确扫描，召回 100%；大知识库由 :mod:`search.ann` 选择
    知识库自己的部分 HNSW 索引或共享索引的迭代扫描，凑不满候选时退回精确扫描。``plan`` 是检索服务在请求开始时
    读好的 :func:`search_plan`（不给时这里读）；``exact`` 显式指定时覆盖自动选择（基准与测试用）。
    ``exclude`` 是布尔查询里 ``-词`` 的 tsquery：向量路同样排除含这些词的分块。
    """
    if kb.embedding_dimension not in SUPPORTED_DIMENSIONS:
        raise ValueError(f"unsupported embedding dimension {kb.embedding_dimension}")
    index, chunks = None, 0
    if exact is not True:  # 显式要精确扫描时不必读知识库状况
        plan = plan or search_plan(kb)
        exact = plan.exact if exact is None else exact
        index, chunks = plan.index, plan.estimate
    scope, params = _scope_sql(kb, filters)
    query = vector_literal(query_vector)
    # 排除 -词：按距离多取一些候选，去掉满足排除式的，不够 limit 再取更深（结果与逐行过滤相同：前 depth 个里
    # 留下的就是过滤后的前几名）。分块行里没有词项（在全文引擎里：正排约 30 微秒解一个），没法在 ANN 的 SQL 里
    # 逐行检查；只查候选，精确扫描也不必对库里每一块都做一遍
    depth = limit * 2 if exclude else limit
    while True:
        rows, method = ann.ann_search(kb, query=query, scope=scope, params=params, limit=depth, exact=exact,
                                      index=index, chunks=chunks)
        excluded = _excluded(kb, [chunk_id for chunk_id, _ in rows], exclude) if exclude else set()
        kept = [PathHit(chunk_id, distance) for chunk_id, distance in rows if chunk_id not in excluded]
        if len(kept) >= limit or len(rows) < depth:
            return kept[:limit], method
        depth *= 4


def _excluded(kb: KnowledgeBase, chunk_ids: Sequence[int], exclude: str) -> set[int]:
    """这些分块里满足排除式（tsquery）的：由引擎按它登记的词项判断（排除式含短语时对原文重新切词）。"""
    return fulltext_engine().matching(kb.id, chunk_ids, exclude) if chunk_ids else set()


def vector_literal(vector: np.ndarray) -> str:
    """pgvector 的向量字面量（float32 的 7 位有效数字，往返无损）。"""
    return "[" + ",".join(f"{x:.7g}" for x in np.asarray(vector, dtype=np.float32).tolist()) + "]"


def fulltext_search(kb: KnowledgeBase, query: ParsedQuery, filters: SearchFilters, limit: int) -> FulltextHits:
    """全文检索：检索范围内与查询匹配的分块，按相关性（默认 BM25）降序的前 ``limit`` 个。"""
    sql, params = _scope_sql(kb, filters)
    documents = _documents_sql(kb) if filters == SearchFilters() else None
    return fulltext_engine().search(kb.id, query, ChunkScope(sql, params, documents), limit)


def fulltext_scores(kb: KnowledgeBase, query: ParsedQuery, chunk_ids: Sequence[int],
                    statistics: Bm25Statistics) -> dict[int, float]:
    """知识库里指定分块在这个查询上的完整全文分：给全文一路没列出的候选补上真实的分数（见 docs/INVARIANTS.md 的
    EVIDENCE-OWN），与全文一路同一个公式、同一份统计。"""
    return fulltext_engine().scores(kb.id, query, chunk_ids, statistics)


def load_chunks(chunk_ids: Sequence[int], *, kb: KnowledgeBase | None = None,
                query_vector: np.ndarray | None = None) -> dict[int, ChunkRow]:
    """一次读出命中分块的文本、元数据与所属文档。

    给了 ``kb`` 与查询向量时顺带算出每块到它的余弦距离（``ChunkRow.distance``，与精确扫描同一个表达式；维度不是
    知识库维度的分块为 None）：混合检索给向量一路没列出的候选补真实的距离（见 docs/INVARIANTS.md 的 EVIDENCE-OWN），
    这些候选正是这里读的分块，不必为它们再发一条语句。"""
    if not chunk_ids:
        return {}
    columns = ""
    params: list[Any] = [list(chunk_ids)]
    if kb is not None and query_vector is not None:
        dim = kb.embedding_dimension
        if dim not in SUPPORTED_DIMENSIONS:
            raise ValueError(f"unsupported embedding dimension {dim}")
        columns = f", CASE WHEN c.embedding_dim = %s::int THEN {ann.stored_distance(dim)} END"
        params = [dim, vector_literal(query_vector), list(chunk_ids)]
    rows = fetchall_prepared(
        search_connection(),
        "SELECT c.id, c.document_id, c.chunk_index, c.chunk_text, d.filename, c.metadata, c.role, c.parent_id,"
        f" d.created_at{columns} FROM document_chunks c JOIN documents d ON d.id = c.document_id"
        " WHERE c.id = ANY(%s::bigint[])",
        params,
    )
    return {
        int(row[0]): ChunkRow(
            chunk_id=int(row[0]), document_id=row[1], chunk_index=int(row[2]), text=row[3], filename=row[4],
            metadata=_as_dict(row[5]), role=row[6], parent_id=row[7], document_created=row[8],
            distance=float(row[9]) if len(row) > 9 and row[9] is not None else None,
        )
        for row in rows
    }


def load_parents(parent_ids: Sequence[int]) -> dict[int, tuple[str, dict[str, Any]]]:
    """父块 id → (文本, 元数据)。"""
    if not parent_ids:
        return {}
    with search_connection().cursor() as cursor:
        cursor.execute("SELECT id, chunk_text, metadata FROM document_chunks WHERE id = ANY(%s)", [list(parent_ids)])
        return {int(pid): (text, _as_dict(meta)) for pid, text, meta in cursor.fetchall()}


def _as_dict(value: Any) -> dict[str, Any]:
    """Django 让 psycopg 把 jsonb 读成字符串（交给 JSONField 解析）；原始游标这里自己解析。"""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        parsed = json.loads(value)
        return parsed if isinstance(parsed, dict) else {}
    return {}
