"""两路召回的 SQL：pgvector 余弦距离与 PostgreSQL 全文检索，以及命中分块的详情读取。

两路共用同一个检索范围（:func:`_scope_sql`）：指定知识库、``completed`` 文档、可检索角色（普通块与子块，
父块只用来回填上下文）、以及调用方的元数据过滤条件。
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
from documents.models import Document
from infra.routers import search_connection
from knowledge.models import SUPPORTED_DIMENSIONS, KnowledgeBase
from raglib.analysis import ParsedQuery
from raglib.bm25 import Bm25Params, allot_postings, chunk_score, coverage, max_score, score_terms
from search import ann, bm25


@dataclass(frozen=True)
class PathHit:
    """某一路召回的一个分块：余弦距离（向量），或全文的 BM25 分数（``ts_rank_cd`` 排序时是归一到 0~1 的 rank）。"""

    chunk_id: int
    value: float


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


def _scope_sql(kb: KnowledgeBase, filters: SearchFilters) -> tuple[str, list[Any]]:
    """检索范围：知识库内、completed 文档的普通块与子块。文档状态用半连接判断，便于规划器走向量/GIN 索引。"""
    extra, params = filters.sql()
    sql = (
        "c.knowledge_base_id = %s AND c.role <> 'parent'"
        " AND c.document_id IN (SELECT d.id FROM documents d WHERE d.knowledge_base_id = %s AND d.status = %s)"
        + extra
    )
    return sql, [kb.id, kb.id, Document.Status.COMPLETED, *params]


@dataclass(frozen=True)
class SearchPlan:
    """检索开始时在检索连接上读到的知识库状况：可检索分块数的估计（completed 文档的 chunk_count 之和，含父块），
    以及它自己的 ANN 索引在这个库上的状态（没有为 None）。"""

    estimate: int
    index: ann.KbIndex | None

    @property
    def exact(self) -> bool:
        """小知识库精确扫描（召回 100%）。"""
        return self.estimate <= settings.EXACT_SEARCH_MAX_CHUNKS


def search_plan(kb: KnowledgeBase) -> SearchPlan:
    """一条查询读出 :class:`SearchPlan`（每个检索请求一次往返：分块数读文档表，索引状态查系统目录，都是几十微秒）。

    两者都在 ``search_connection()`` 上读：向量查询在哪个库上执行，就看哪个库上的索引。
    """
    with search_connection().cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT coalesce(sum(chunk_count), 0) FROM documents WHERE knowledge_base_id = %s"
            " AND status = %s), s.valid, s.opcname, s.definition FROM (SELECT 1) one"
            f" LEFT JOIN LATERAL ({ann.INDEX_STATE_SQL}) s ON true",
            [kb.id, Document.Status.COMPLETED, ann.kb_index_name(kb.id)],
        )
        row = cursor.fetchone()
    return SearchPlan(int(row[0]), ann.kb_index_from_row(kb.id, row[1:]))


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
    if exclude:
        scope += " AND NOT (coalesce(c.search_vector, ''::tsvector) @@ %s::tsquery)"
        params.append(exclude)
    rows, method = ann.ann_search(kb, query=vector_literal(query_vector), scope=scope, params=params, limit=limit,
                                  exact=exact, index=index, chunks=chunks)
    return [PathHit(chunk_id, distance) for chunk_id, distance in rows], method


def vector_literal(vector: np.ndarray) -> str:
    """pgvector 的向量字面量（float32 的 7 位有效数字，往返无损）。"""
    return "[" + ",".join(f"{x:.7g}" for x in np.asarray(vector, dtype=np.float32).tolist()) + "]"


@dataclass(frozen=True)
class Bm25Statistics:
    """一个查询用到的知识库统计：分块数、平均词数、各查询词的 df（键为 (词位, 是否前缀)）。"""

    n: int
    avgdl: float
    dfs: dict[tuple[str, bool], int]


@dataclass(frozen=True)
class FulltextHits:
    """全文一路的结果：命中，以及查询的 IDF 质量在本库中出现的比例（``raglib.bm25.coverage``，融合用来调权重）。"""

    hits: list[PathHit]
    coverage: float
    # 这个查询在本库里可能得到的最高分（BM25：Σ qtf·idf·(k1+1)，库里没有的词按最大 IDF 计入）；
    # 命中的分数除以它就是 0~1 的“匹配程度”，跨查询可比，用来校准对外分数。ts_rank_cd 本身已在 0~1，为 1
    scale: float = 1.0
    # BM25 排序时这次查询读到的统计（给名单外的候选补分数用，见 fulltext_scores）；ts_rank_cd 排序时为 None
    statistics: Bm25Statistics | None = None


def fulltext_search(kb: KnowledgeBase, query: ParsedQuery, filters: SearchFilters, limit: int) -> FulltextHits:
    """全文检索：GIN 索引上的 ``@@`` 匹配，按 ``RAG_FULLTEXT_RANKING``（默认 BM25）降序取前 ``limit`` 个。

    exact 查询除了词序匹配，还要求原文（不区分大小写）逐字包含引号里的内容。
    """
    if not query.tsquery:
        return FulltextHits([], 0.0)
    n, avgdl, dfs = bm25.load_statistics(kb.id, query.terms)
    cover = coverage(query.terms, dfs, n)
    if settings.FULLTEXT_RANKING == "ts_rank_cd":
        return FulltextHits(_ts_rank_cd_search(kb, query, filters, limit), cover)
    scale = max_score(query.terms, dfs, n, settings.BM25_K1)
    return FulltextHits(_bm25_search(kb, query, filters, limit, n, avgdl, dfs), cover, scale,
                        Bm25Statistics(n, avgdl, dfs))


def _bm25_params() -> Bm25Params:
    return Bm25Params(settings.BM25_K1, settings.BM25_B, settings.BM25_TITLE_WEIGHT)


def fulltext_scores(query: ParsedQuery, chunk_ids: Sequence[int], statistics: Bm25Statistics) -> dict[int, float]:
    """指定分块在这个查询上的完整 BM25 分（不截断倒排），由分块自己的 tsvector 算出；一个查询词都没有的分块为 0。

    全文一路只返回前若干名，混合检索的候选里总有它没列出的分块：给它们补上真实的分数，而不是借用名单里
    别的分块的分数（见 docs/INVARIANTS.md 的 EVIDENCE-OWN）。与倒排表上的打分同一个公式
    （:func:`raglib.bm25.chunk_score`）。
    """
    scores = dict.fromkeys(chunk_ids, 0.0)
    params = _bm25_params()
    terms = score_terms(query.terms, statistics.dfs, statistics.n, params)
    if not terms or not chunk_ids:
        return scores
    exact = [t.term.lexeme for t in terms if not t.term.prefix]
    prefixes = [t.term.lexeme for t in terms if t.term.prefix]
    counts: dict[int, dict[str, tuple[int, int]]] = {}
    lengths: dict[int, int] = {}
    with search_connection().cursor() as cursor:
        # 标题部分的位置权重是 A，正文是 B（见 raglib.analysis），与触发器写倒排时的口径相同
        cursor.execute(
            "SELECT c.id, c.search_length, u.lexeme, coalesce(cardinality(array_positions(u.weights, 'A')), 0),"
            " cardinality(u.weights) FROM document_chunks c, unnest(c.search_vector) u"
            " WHERE c.id = ANY(%s) AND (u.lexeme = ANY(%s::text[])"
            " OR EXISTS (SELECT 1 FROM unnest(%s::text[]) p WHERE starts_with(u.lexeme, p)))",
            [list(chunk_ids), exact, prefixes],
        )
        for chunk_id, length, lexeme, title, total in cursor.fetchall():
            counts.setdefault(int(chunk_id), {})[lexeme] = (int(title), int(total) - int(title))
            lengths[int(chunk_id)] = int(length)
    for chunk_id, chunk_counts in counts.items():
        scores[chunk_id] = chunk_score(terms, chunk_counts, lengths[chunk_id], params, statistics.avgdl)
    return scores


def vector_distances(kb: KnowledgeBase, query_vector: np.ndarray, chunk_ids: Sequence[int]) -> dict[int, float]:
    """指定分块到查询向量的余弦距离（与精确扫描同一个表达式）：给向量一路没列出的候选补上真实的距离。"""
    dim = kb.embedding_dimension
    if dim not in SUPPORTED_DIMENSIONS:
        raise ValueError(f"unsupported embedding dimension {dim}")
    if not chunk_ids:
        return {}
    with search_connection().cursor() as cursor:
        cursor.execute(f"SELECT id, embedding::vector({dim}) <=> %s::vector({dim}) FROM document_chunks"
                       " WHERE id = ANY(%s) AND embedding_dim = %s",
                       [vector_literal(query_vector), list(chunk_ids), dim])
        return {int(chunk_id): float(distance) for chunk_id, distance in cursor.fetchall()}


def _match_sql(kb: KnowledgeBase, query: ParsedQuery, filters: SearchFilters) -> tuple[str, list[Any]]:
    """两种排序共用的命中条件（不含 tsquery 本身）：检索范围 + exact 查询的原文包含。"""
    scope, params = _scope_sql(kb, filters)
    if query.type == "exact":
        scope += "".join(" AND strpos(lower(c.chunk_text), lower(%s)) > 0" for _ in query.phrases)
        params += list(query.phrases)
    return scope, params


def _ts_rank_cd_search(kb: KnowledgeBase, query: ParsedQuery, filters: SearchFilters, limit: int) -> list[PathHit]:
    """``ts_rank_cd``（标题 A 权重、正文 B 权重；标志 32 归一到 0~1）：规格点名的排序，没有 IDF 与长度归一。"""
    scope, params = _match_sql(kb, query, filters)
    # 命中用 tsquery；排序用 rank_tsquery（phrase 查询里可选的词只抬高排名，不决定是否命中）
    sql = (
        "SELECT c.id, ts_rank_cd(c.search_vector, q.rank_query, 32) AS rank"
        " FROM document_chunks c, (SELECT %s::tsquery AS query, %s::tsquery AS rank_query) q"
        f" WHERE c.search_vector @@ q.query AND {scope}"
        " ORDER BY rank DESC, c.id LIMIT %s"
    )
    with search_connection().cursor() as cursor:
        cursor.execute(sql, [query.tsquery, query.rank_tsquery or query.tsquery, *params, limit])
        rows = cursor.fetchall()
    return [PathHit(int(chunk_id), float(rank)) for chunk_id, rank in rows]


def _bm25_search(kb: KnowledgeBase, query: ParsedQuery, filters: SearchFilters, limit: int,
                 n: int, avgdl: float, dfs: dict[tuple[str, bool], int]) -> list[PathHit]:
    """BM25（见 :mod:`search.bm25`）：倒排表上按 (分块, 查询词) 汇总加权词频，再按分块求和。

    每个查询词读 :func:`raglib.bm25.allot_postings` 分给它的行数：影响力最高的那一段（倒排主键按影响力排序）。
    前缀词（孤立的单字，``'肝':*``）是一段词位范围，整段读：先把同一查询词在一个分块里命中的各词位的词频相加，
    再做饱和，与 tsquery 的前缀匹配一致。非 plain 查询（短语、布尔、exact）另外要求分块满足 tsquery。
    """
    params = _bm25_params()
    reads = allot_postings(score_terms(query.terms, dfs, n, params), settings.BM25_MAX_POSTINGS)
    if not reads:
        return []  # 没有一个查询词出现在这个知识库里
    lows = [r.scored.term.lexeme for r in reads]
    # 精确词：low = high；前缀词：到该前缀下最大的码点为止
    highs = [r.scored.term.lexeme + ("\U0010ffff" if r.scored.term.prefix else "") for r in reads]
    scoring_args: list[Any] = [list(range(len(reads))), lows, highs, [r.scored.weight for r in reads],
                               [r.scored.term.prefix for r in reads], [r.rows for r in reads],
                               params.title_weight, params.k1 * (1 - params.b), params.k1 * params.b / max(avgdl, 1e-9)]
    # 先只拿分数最高的一批回表检查范围（状态、过滤条件）：长问题会命中上千个分块，逐个回表占全文一路一半的时间。
    # 范围内的结果不够 limit 且确实有分块被这一批截掉时，再对全部候选做一次——结果与一次做完全相同
    shortlist = max(limit * 4, _BM25_SHORTLIST)
    rows = _bm25_rows(kb, query, filters, scoring_args, limit, shortlist)
    if len(rows) < limit and (not rows or rows[0][2] > shortlist):
        rows = _bm25_rows(kb, query, filters, scoring_args, limit, None)
    return [PathHit(int(chunk_id), float(value)) for chunk_id, value, _ in rows]


_BM25_SHORTLIST = 400


# BM25 的一项：加权词频 tf 的饱和，长度按 avgdl 归一：tf / (tf + k1·(1 - b + b·dl/avgdl))。
# 常数先合并成 k 行的 c0 = k1·(1-b)、c1 = k1·b/avgdl（_bm25_search 里算）：每行倒排少算几次浮点运算
_BM25_SATURATE = "{tf} / ({tf} + k.c0 + k.c1 * {length})"
# 一个查询词读倒排：一次主键范围扫描，只读打分要的几列（仅索引扫描）
_BM25_READ = ("(SELECT chunk_id, k.tw * title_tf + body_tf AS tf, length FROM fulltext_postings"
              " WHERE knowledge_base_id = %s AND {terms}) p")
# 精确词倒着扫（影响力从高到低），读够分到的行数就停；每个分块只有一行，读出来就计分。
# 两支各自读倒排、不经物化的 CTE：1M 行上 2 万行倒排的查询少 10~25% 的时间
_BM25_EXACT_PARTS = (
    f"SELECT p.chunk_id, q.weight * {_BM25_SATURATE.format(tf='p.tf', length='p.length')} AS part"
    " FROM q CROSS JOIN k CROSS JOIN LATERAL "
    + _BM25_READ.format(terms="NOT q.prefix AND lexeme = q.low ORDER BY impact DESC LIMIT q.rows")
)
# 前缀词（一段词位范围）：先把同一分块里命中的各词位的词频相加再饱和，与 tsquery 的前缀匹配一致。
# 通常整段读（分到的行数就是那一段的行数）；只有它读不起、又是唯一能读的词时截在额度上（倒着扫，最多 q.rows 行），
# 一个 1M 分块的库里常见单字的那一段有近百万行
_BM25_PREFIX_PARTS = (
    f"SELECT p.chunk_id, max(q.weight) * {_BM25_SATURATE.format(tf='sum(p.tf)', length='max(p.length)')}"
    " FROM q CROSS JOIN k CROSS JOIN LATERAL "
    + _BM25_READ.format(terms="q.prefix AND lexeme >= q.low AND lexeme <= q.high"
                        " ORDER BY lexeme DESC, impact DESC LIMIT q.rows")
    + " GROUP BY p.chunk_id, q.term, k.c0, k.c1"
)


def _bm25_rows(kb: KnowledgeBase, query: ParsedQuery, filters: SearchFilters, scoring_args: list[Any],
               limit: int, shortlist: int | None) -> list[tuple[Any, ...]]:
    """(分块 id, BM25 分, 候选数)，范围内按分数降序的前 ``limit`` 个。``shortlist`` 限定回表的候选数：这时只取前
    ``shortlist + 1`` 个候选，候选数大于 ``shortlist`` 就说明有分块被截掉了。"""
    scope, scope_params = _match_sql(kb, query, filters)
    must = "" if query.type == "plain" else " AND c.search_vector @@ %s::tsquery"
    # 没有前缀词时不带前缀那一支：它的行数估计（整段词位范围）有上亿行，规划器会因此把 2 万行的汇总改成先排序。
    # scoring_args 的第 5 个数组是各查询词是否前缀
    prefix = any(scoring_args[4])
    parts = _BM25_EXACT_PARTS + (f" UNION ALL {_BM25_PREFIX_PARTS}" if prefix else "")
    sql = (
        "WITH q(term, low, high, weight, prefix, rows) AS"
        " (SELECT * FROM unnest(%s::int[], %s::text[], %s::text[], %s::float8[], %s::bool[], %s::int[])),"
        " k(tw, c0, c1) AS (SELECT %s::float8, %s::float8, %s::float8),"
        f" s AS (SELECT chunk_id, sum(part) AS score FROM ({parts}) part GROUP BY chunk_id),"
        # 多取一个候选：取满 shortlist + 1 个就说明有分块被截掉。只数 top 而不数 s，s 只被引用一次，不必物化
        f" top AS (SELECT chunk_id, score FROM s ORDER BY score DESC, chunk_id{' LIMIT %s' if shortlist else ''})"
        # 范围检查逐个候选按主键回表（OFFSET 0 阻止展平）：展平成连接时规划器低估候选数，曾把整个知识库的分块
        # 读出来做哈希连接（100k 分块时 125 ms，逐个回表 400 个只要几毫秒）
        " SELECT c.id, top.score, (SELECT count(*) FROM top) FROM top CROSS JOIN LATERAL"
        f" (SELECT c.id FROM document_chunks c WHERE c.id = top.chunk_id AND {scope}{must} OFFSET 0) c"
        " ORDER BY top.score DESC, c.id LIMIT %s"
    )
    args = [*scoring_args, kb.id, *([kb.id] if prefix else []), *([shortlist + 1] if shortlist else []), *scope_params,
            *([query.tsquery] if must else []), limit]
    with search_connection().cursor() as cursor:
        cursor.execute(sql, args)
        return list(cursor.fetchall())


def load_chunks(chunk_ids: Sequence[int]) -> dict[int, ChunkRow]:
    """一次读出命中分块的文本、元数据与所属文档。"""
    if not chunk_ids:
        return {}
    with search_connection().cursor() as cursor:
        cursor.execute(
            "SELECT c.id, c.document_id, c.chunk_index, c.chunk_text, d.filename, c.metadata, c.role, c.parent_id,"
            " d.created_at FROM document_chunks c JOIN documents d ON d.id = c.document_id WHERE c.id = ANY(%s)",
            [list(chunk_ids)],
        )
        rows = cursor.fetchall()
    return {
        int(row[0]): ChunkRow(
            chunk_id=int(row[0]), document_id=row[1], chunk_index=int(row[2]), text=row[3], filename=row[4],
            metadata=_as_dict(row[5]), role=row[6], parent_id=row[7], document_created=row[8],
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
