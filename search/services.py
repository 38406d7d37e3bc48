"""检索服务：向量与全文两路并行召回 → RRF 融合 → 重排序（可降级）→ 父子块去重 → 截取 top_k。

降级原则（见 docs/INVARIANTS.md 的 DEGRADE-ONE-PATH）：任何一路失败都不让请求失败。向量路（查询向量化或 SQL）
失败就只用全文结果，全文路失败（记录错误日志并视为空结果）就只用向量结果，重排序不可用就保留融合顺序；每一种降级都会记日志、
计入 ``search_degraded_total``，并写进 :attr:`SearchOutcome.degraded`（接口放在 ``X-Search-Degraded`` 头里）。
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np
import structlog
from django.conf import settings
from django.db import close_old_connections, transaction

from documents.filters import SearchFilters
from infra.embedders import locally_available
from infra.metrics import SEARCH_DEGRADED, SEARCH_REQUESTS, SEARCH_STAGE_SECONDS
from infra.principal import Principal
from knowledge.models import KnowledgeBase
from knowledge.selectors import usable_knowledge_base
from raglib import analysis
from raglib.bm25 import term_idf
from raglib.fusion import (
    Fused,
    collapse_by,
    context_window,
    lexical_gate,
    order_by_scores,
    rrf_fuse,
    similarity_from_distance,
)
from raglib.providers.rerank import RerankUnavailable
from raglib.proximity import sentence_share
from raglib.relevance import LIFT_RANK, Evidence, candidate_features
from raglib.retrieval_profile import FusionParameters, RetrievalProfile
from raglib.scoring import (
    Calibration,
    fulltext_score,
    hybrid_logit,
    hybrid_score,
    match_ratio,
    vector_score,
)
from search.profiles import knowledge_base_script, relevance_model, retrieval_profile
from search.query_embeddings import embed_query
from search.rerankers import configured_reranker
from search.retrieval import (
    Bm25Statistics,
    ChunkRow,
    PathHit,
    SearchPlan,
    fulltext_scores,
    fulltext_search,
    load_chunks,
    load_parents,
    search_plan,
    vector_search,
)

logger = structlog.get_logger(__name__)

Mode = Literal["hybrid", "vector", "fulltext"]
MODES: tuple[Mode, ...] = ("hybrid", "vector", "fulltext")
Order = Literal["score", "position"]
T = TypeVar("T")

# 向量路（查询向量化 + SQL）在这个线程池里执行，全文路在请求线程里同时执行。
# 池中线程各有自己的数据库连接，按 RAG_DB_CONN_MAX_AGE 复用（见 _in_worker）。
_executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="search-vector")


@dataclass(frozen=True)
class SearchRequest:
    query: str
    top_k: int = 5
    mode: Mode = "hybrid"
    rerank: bool = True
    return_parent: bool = True
    order: Order = "score"
    filters: SearchFilters = field(default_factory=SearchFilters)
    # 低于此分的结果不返回（在截取 top_k 之前过滤，所以返回的条数可能少于 top_k）
    min_score: float | None = None


@dataclass
class SearchResult:
    """一条结果及其来历（调试页展示各路名次与分数）。"""

    chunk: ChunkRow
    score: float
    vector_rank: int | None = None
    vector_similarity: float | None = None
    fulltext_rank: int | None = None
    fulltext_score: float | None = None
    # 全文的匹配程度（0~1，跨查询可比，见 raglib.scoring.match_ratio）
    fulltext_unit: float | None = None
    # 查询词的邻近程度（0~1，见 raglib.proximity）：混合方式排在前 PROXIMITY_DEPTH 名的候选才有
    proximity: float | None = None
    # 校准分数所用的证据（相似度, 匹配程度, 邻近程度），都是这条结果自己的值（见 EVIDENCE-OWN）；评测据此拟合校准参数
    evidence: tuple[float, float, float] | None = None
    # 相关概率模型的特征（见 raglib.relevance.candidate_features）；调试页展示，拟合模型时收集
    features: dict[str, float] | None = None
    # 分数来自知识库学出的模型（True）还是全局校准参数（False）
    learned: bool = False
    fused_score: float | None = None
    rerank_score: float | None = None
    parent_chunk_id: int | None = None
    parent_text: str | None = None

    def relevance_evidence(self, fused_rank: int) -> Evidence:
        """这条结果给相关概率模型的证据（:func:`raglib.relevance.candidate_features` 的输入）。"""
        return Evidence(self.vector_similarity, self.fulltext_unit, self.vector_rank, self.fulltext_rank, fused_rank,
                        self.proximity)

    @property
    def found_by(self) -> list[str]:
        return [path for path, rank in (("vector", self.vector_rank), ("fulltext", self.fulltext_rank)) if rank]


@dataclass
class SearchOutcome:
    results: list[SearchResult]
    timings_ms: dict[str, float] = field(default_factory=dict)
    degraded: list[str] = field(default_factory=list)
    vector_method: str | None = None
    query_type: str | None = None
    reranked: bool = False
    embedding_cached: bool | None = None
    # 两路都参与时的 RRF 权重（调试页展示；全文一路的权重已乘上覆盖率闸门）
    fusion_weights: dict[str, float] = field(default_factory=dict)

    def server_timing(self) -> str:
        """``Server-Timing`` 头：各阶段毫秒数。"""
        return ", ".join(f"{stage};dur={ms:.1f}" for stage, ms in self.timings_ms.items())


@dataclass
class _PathResult:
    hits: list[PathHit] = field(default_factory=list)
    failed: bool = False
    timings_ms: dict[str, float] = field(default_factory=dict)
    method: str | None = None
    cached: bool | None = None
    # 全文一路：查询的 IDF 质量在本库中出现的比例（见 raglib.bm25.coverage），以及把分数折成 0~1 的除数
    coverage: float | None = None
    scale: float = 1.0
    statistics: Bm25Statistics | None = None
    # 向量一路：查询向量（给全文一路独有的候选补余弦相似度）
    query_vector: np.ndarray | None = None


class _Clock:
    """记录各阶段耗时（毫秒）并写入直方图。"""

    def __init__(self, timings: dict[str, float]) -> None:
        self.timings = timings

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            self.timings[name] = self.timings.get(name, 0.0) + elapsed * 1000
            SEARCH_STAGE_SECONDS.labels(stage=name).observe(elapsed)


def searchable_knowledge_base(*, principal: Principal, kb_id: str | uuid.UUID) -> KnowledgeBase:
    """检索前的校验：存在（404）→ 可用（403 KNOWLEDGE_BASE_UNAVAILABLE）→ 读权限（403）。"""
    return usable_knowledge_base(principal=principal, kb_id=kb_id, write=False)


def candidate_count(top_k: int) -> int:
    """融合后交给重排序的候选数：min(top_k*3, RAG_MAX_RERANK_CANDIDATES)，且不少于 top_k。"""
    return max(top_k, min(top_k * 3, settings.MAX_RERANK_CANDIDATES))


def path_depth(top_k: int, mode: Mode) -> int:
    """每一路召回的深度。混合检索：不少于候选数，也不少于 RAG_FUSION_DEPTH（上限 RAG_MAX_RERANK_CANDIDATES）——
    RRF 只看名次：一路只取 15 个时，在另一路排第 16~50 名的好结果拿不到这一路的分，融合就退化成交替合并。

    单路检索只用前“候选数”个（对外分数也只看每条结果自己的值），多取的部分白白花数据库时间：50k 分块的库走自己的
    halfvec 索引时，取 50 个（过采样 200、ef_search 400）约 14 ms，取 15 个约 6 ms（``bench/README.md``）。
    """
    if mode == "vector":
        # 向量方式的 similarity_lift 以第 LIFT_RANK 名为参照：top_k 再小也取够这么多，分数才不随 top_k 变
        return max(candidate_count(top_k), LIFT_RANK)
    if mode != "hybrid":
        return candidate_count(top_k)
    return max(candidate_count(top_k), min(settings.FUSION_DEPTH, settings.MAX_RERANK_CANDIDATES))


def fusion_weights(text: _PathResult | None, fusion: FusionParameters) -> dict[str, float]:
    """两路的 RRF 权重（参数来自知识库的检索画像）。全文一路 = (基础权重 + 匹配加成 * 最佳匹配程度) 再乘覆盖率
    闸门：问题与某个分块字面上高度重合（最佳匹配程度高）时全文一路更可信；查询的词在库里大多没出现时
    （另一种语言的问题）闸门把它关掉。"""
    weight = fusion.fulltext_weight
    if text is not None and text.coverage is not None:
        best = match_ratio(text.hits[0].value, text.scale) if text.hits else 0.0
        weight = (weight + fusion.fulltext_match_boost * best) * coverage_gate(text.coverage, fusion)
    return {"vector": fusion.vector_weight, "fulltext": weight}


def search(kb: KnowledgeBase, request: SearchRequest) -> SearchOutcome:
    """执行一次检索。只抛编程错误；外部依赖的失败都转成降级。"""
    SEARCH_REQUESTS.labels(mode=request.mode).inc()
    outcome = SearchOutcome(results=[])
    clock = _Clock(outcome.timings_ms)
    started = time.perf_counter()
    try:
        _run(kb, request, outcome, clock)
    finally:
        elapsed = time.perf_counter() - started
        outcome.timings_ms["total"] = elapsed * 1000
        SEARCH_STAGE_SECONDS.labels(stage="total").observe(elapsed)
    for reason in outcome.degraded:
        SEARCH_DEGRADED.labels(reason=reason).inc()
    return outcome


def _run(kb: KnowledgeBase, request: SearchRequest, outcome: SearchOutcome, clock: _Clock) -> None:
    plan = search_plan(kb)
    profile = retrieval_profile(kb)
    if plan.estimate == 0:
        return  # 没有已完成摄取的文档：空数组，而不是错误（见 docs/INVARIANTS.md 的 EMPTY-KB-EMPTY-RESULT）
    limit = candidate_count(request.top_k)
    depth = path_depth(request.top_k, request.mode)
    parsed = analysis.parse_query(request.query, analyzer=settings.FULLTEXT_ANALYZER)
    outcome.query_type = parsed.type

    while True:
        paths, text_result = _retrieve(kb, request, outcome, clock, plan, parsed, depth)
        if not paths:
            return
        with clock.stage("fuse"):
            if len(paths) > 1:
                outcome.fusion_weights = fusion_weights(text_result, profile.fusion)
            fused = rrf_fuse({name: [hit.chunk_id for hit in result.hits] for name, result in paths.items()},
                             k=profile.fusion.rrf_k, weights=outcome.fusion_weights or None)
            # 先读前 limit 个；其中有子块（父子分块的库）时才把其余的也读出来，供按父块凑满候选。两路都在时顺带
            # 算出到查询向量的距离，给向量一路没列出的候选补证据（_complete_evidence）
            vector = paths["vector"].query_vector if len(paths) > 1 else None
            chunks = load_chunks([f.key for f in fused[:limit]], kb=kb, query_vector=vector)
            if any(chunk.role == "child" for chunk in chunks.values()):
                chunks.update(load_chunks([f.key for f in fused[limit:]], kb=kb, query_vector=vector))
        # 父子分块：同一父块的子块最后只留一个，按分块数截断会让结果少于 top_k 个父块。候选改为“覆盖 limit 个
        # 父块（普通分块各算一个）的最短前缀”；各路都取满了深度却还凑不够 top_k 个父块时，加倍深度再取一次
        # （见 docs/INVARIANTS.md 的 PARENT-FILL）
        exhausted = all(len(result.hits) < depth for result in paths.values())
        if exhausted or depth >= MAX_PARENT_FILL_DEPTH or _groups(fused, chunks) >= request.top_k:
            break
        depth = min(depth * 2, MAX_PARENT_FILL_DEPTH)

    with clock.stage("fuse"):
        fused = _prefix_covering(fused, chunks, limit)
        values = {name: {hit.chunk_id: hit.value for hit in result.hits} for name, result in paths.items()}
        candidates = [
            SearchResult(
                chunk=chunks[f.key],
                score=0.0,
                vector_rank=f.ranks.get("vector"),
                vector_similarity=_maybe(values.get("vector", {}).get(f.key), similarity_from_distance),
                fulltext_rank=f.ranks.get("fulltext"),
                fulltext_score=values.get("fulltext", {}).get(f.key),
                fused_score=f.score,
            )
            for f in fused
        ]
        _complete_evidence(kb, parsed, candidates, paths)
        _score(kb, profile, parsed, candidates, paths, depth)
        # 融合决定候选集合，排序按每条结果自己的相关概率：分数随名次不增，而且不借用别的结果的分数
        candidates = [item for item, _ in order_by_scores(candidates, [c.score for c in candidates])]

    if request.rerank and candidates:
        _rerank(request.query, candidates, outcome, clock)
        candidates = [item for item, _ in order_by_scores(candidates, [c.score for c in candidates])]

    # 同一父块的多个子块只留得分最高的一个（已按分数降序）
    results = collapse_by(candidates, lambda r: _group(r.chunk))
    if request.min_score is not None:
        results = [r for r in results if r.score >= request.min_score]
    results = results[:request.top_k]
    if request.return_parent:
        _attach_parents(results)
    outcome.results = context_order(results) if request.order == "position" else results


def _retrieve(kb: KnowledgeBase, request: SearchRequest, outcome: SearchOutcome, clock: _Clock, plan: SearchPlan,
              parsed: analysis.ParsedQuery, depth: int) -> tuple[dict[str, _PathResult], _PathResult | None]:
    """按方式跑一路或两路召回（两路并行），记录降级；返回可用的各路结果与全文一路（融合权重要用它）。"""
    vector_future: Future[_PathResult] | None = None
    if request.mode in ("hybrid", "vector"):
        vector_future = _executor.submit(_in_worker, _vector_path, kb, request, depth, plan, parsed.exclude)
    text_result: _PathResult | None = None
    if request.mode in ("hybrid", "fulltext"):
        text_result = _fulltext_path(kb, parsed, request.filters, depth, clock)
    vector_result = vector_future.result() if vector_future is not None else None
    if vector_result is not None:
        outcome.timings_ms.update(vector_result.timings_ms)
        outcome.vector_method = vector_result.method
        outcome.embedding_cached = vector_result.cached
        if vector_result.failed and text_result is None:
            # 只要向量的请求在向量路不可用时退回全文（embedding 不可用则只做全文检索，见 DEGRADE-ONE-PATH）
            text_result = _fulltext_path(kb, parsed, request.filters, depth, clock)

    paths = {name: result for name, result in (("vector", vector_result), ("fulltext", text_result))
             if result is not None and not result.failed}
    degraded = []
    if vector_result is not None and vector_result.failed:
        degraded.append("fulltext-only" if "fulltext" in paths else "no-retrieval")
    if text_result is not None and text_result.failed:
        degraded.append("vector-only" if "vector" in paths else "no-retrieval")
    outcome.degraded = list(dict.fromkeys(degraded))
    return paths, text_result


# 父子分块的库凑不满 top_k 个父块时每路最多取到这个深度（见 _run）：子块最多是父块的几倍，再深只是白读
MAX_PARENT_FILL_DEPTH = 400


def _group(chunk: ChunkRow) -> int:
    """结果去重的组：子块归它的父块，其余分块各自一组（用负的分块 id，不会与父块 id 相撞）。"""
    return chunk.parent_id if chunk.role == "child" and chunk.parent_id is not None else -chunk.chunk_id


def _groups(fused: Sequence[Fused], chunks: dict[int, ChunkRow]) -> int:
    return len({_group(chunks[f.key]) for f in fused if f.key in chunks})


def _prefix_covering(fused: Sequence[Fused], chunks: dict[int, ChunkRow], groups: int) -> list[Fused]:
    """融合顺序里覆盖 ``groups`` 个组的最短前缀（读取前被删除的分块直接跳过）。同组的子块都留着：
    重排序可能让组里排在后面的子块胜出，去重在重排之后做。"""
    seen: set[int] = set()
    kept: list[Fused] = []
    for f in fused:
        chunk = chunks.get(f.key)
        if chunk is None:
            continue
        group = _group(chunk)
        if group not in seen:
            if len(seen) == groups:
                break
            seen.add(group)
        kept.append(f)
    return kept


def _maybe(value: float | None, convert: Callable[[float], float]) -> float | None:
    return None if value is None else convert(value)


def _complete_evidence(kb: KnowledgeBase, parsed: analysis.ParsedQuery, candidates: list[SearchResult],
                       paths: dict[str, _PathResult]) -> None:
    """两路都参与时，给每个候选补上它在另一路的真实证据：全文一路独有的候选算出余弦相似度，向量一路独有的
    候选算出完整的 BM25 分（见 docs/INVARIANTS.md 的 EVIDENCE-OWN）。名单外的候选不再借用名单末尾那条的值。"""
    text = paths.get("fulltext")
    if "vector" not in paths or text is None:
        return
    for c in candidates:
        # 距离是回表时一起算的（load_chunks）；向量维度与知识库不同的分块没有距离，留空
        if c.vector_similarity is None and c.chunk.distance is not None:
            c.vector_similarity = similarity_from_distance(c.chunk.distance)
    no_text = [c.chunk.chunk_id for c in candidates if c.fulltext_score is None]
    if no_text and text.statistics is not None:
        scores = fulltext_scores(kb, parsed, no_text, text.statistics)
        for c in candidates:
            if c.fulltext_score is None:
                c.fulltext_score = scores.get(c.chunk.chunk_id, 0.0)


def _score(kb: KnowledgeBase, profile: RetrievalProfile, parsed: analysis.ParsedQuery,
           candidates: list[SearchResult], paths: dict[str, _PathResult], depth: int) -> None:
    """不重排时的 0~1 分数。知识库有学好的相关概率模型（``search.profiles``）时用它：每个候选的特征
    （:func:`raglib.relevance.candidate_features`）→ P(相关)；没有时用检索画像的全局校准（:func:`_calibrated_scores`）。
    特征总是算好挂在结果上：调试页展示它们，拟合模型也从这里收集。"""
    text = paths.get("fulltext")
    for candidate in candidates:
        if text is not None and candidate.fulltext_score is not None:
            candidate.fulltext_unit = match_ratio(candidate.fulltext_score, text.scale)
    coverage = text.coverage if text is not None and text.coverage is not None else 0.0
    gate = coverage_gate(coverage, profile.fusion)
    vector = paths.get("vector")
    if vector is not None and text is not None and text.statistics is not None:
        _proximity(parsed, candidates, text.statistics, gate, profile.calibration)
    # 候选此时还是融合顺序，名次即 RRF 名次
    evidence = [c.relevance_evidence(rank) for rank, c in enumerate(candidates, start=1)]
    rows = candidate_features(evidence, coverage=coverage, depth=depth, gate=gate,
                              calibration=profile.calibration,
                              path_similarities=[similarity_from_distance(hit.value) for hit in vector.hits]
                              if vector is not None else ())
    for candidate, row in zip(candidates, rows, strict=True):
        candidate.features = row
    mode = "hybrid" if len(paths) > 1 else next(iter(paths))
    # 全局校准总是先算：混合方式的模型就建在它的对数几率上，评测拟合全局参数也要它记下的证据
    _calibrated_scores(candidates, paths, coverage, profile)
    model = relevance_model(kb.id, mode)
    if model is None:
        return
    for candidate in candidates:
        assert candidate.features is not None
        candidate.score = model.probability(candidate.features)
        candidate.learned = True


# 邻近程度只给按两路证据（全局校准的对数几率）排在前这么多名的候选算：一个 1,700 字符的分块约 0.1 ms，
# 评测的 top_k=100 有 100 个候选。加分不为负，这些候选加分后仍排在其余候选之前，分数随名次不增；
# 名数固定（不随 top_k），同一个查询的前几名不随 top_k 变
PROXIMITY_DEPTH = 10


def _proximity(parsed: analysis.ParsedQuery, candidates: list[SearchResult], statistics: Bm25Statistics,
               gate: float, calibration: Calibration) -> None:
    """混合方式：给排在前面的候选算查询词的邻近程度（:func:`raglib.proximity.sentence_share`），权重是 BM25 的 IDF。

    全文一路没听懂查询（闸门为 0）时不算：字面的证据不作数。带汉字词的查询也不算：三个开发集上它只在英文的
    squad 上有用（hit@1 +1.5 点），在中文的 cmrc2018、toyhom 上持平或略差（hit@1 低 0.1 点、nDCG@10 低 0.1~0.3 点）
    ——中文问题换了说法，字二元零散地落在长句里，“同一句装下多少”分不出答案块（docs/EVALUATION.md“一句话装下多少查询”）。"""
    if gate <= 0 or calibration.hybrid_proximity == 0 or not parsed.terms or any(t.han for t in parsed.terms):
        return
    weights = {term.lexeme: term_idf(term, statistics.dfs.get((term.lexeme, term.prefix), 0), statistics.n)
               for term in parsed.terms}
    ranked = sorted(candidates, key=lambda c: -hybrid_logit(c.vector_similarity or 0.0,
                                                            (c.fulltext_unit or 0.0) * gate, calibration))
    for candidate in ranked[:PROXIMITY_DEPTH]:
        candidate.proximity = sentence_share(candidate.chunk.text, weights)


def _calibrated_scores(candidates: list[SearchResult], paths: dict[str, _PathResult], coverage: float,
                       profile: RetrievalProfile) -> None:
    """不重排（或重排不可用）时对外的 0~1 分数：校准过的相关概率（见 :mod:`raglib.scoring`）。

    每条结果只用它自己的证据（:func:`_complete_evidence` 补齐了另一路的真实值）；补不出来的（ts_rank_cd 排序、
    分块没有向量）按没有这一路的证据（0）计，不借用别的结果的值。
    """
    calibration = profile.calibration
    if len(paths) == 1:
        for candidate in candidates:
            candidate.score = (vector_score(candidate.vector_similarity, calibration)
                               if candidate.vector_similarity is not None
                               else fulltext_score(candidate.fulltext_unit or 0.0, calibration))
        return
    # 全文一路“没听懂”这个查询（另一种语言的问题，覆盖率低）时，它的匹配程度不算证据：与融合权重用同一个闸门，
    # 否则英文库里恰好含一个数字、人名的分块会被排到向量一路找到的答案前面
    gate = coverage_gate(coverage, profile.fusion)
    for c in candidates:
        similarity, unit, proximity = c.evidence = (c.vector_similarity or 0.0, (c.fulltext_unit or 0.0) * gate,
                                                    (c.proximity or 0.0) * gate)
        c.score = hybrid_score(similarity, unit, calibration, proximity)


def coverage_gate(coverage: float, fusion: FusionParameters) -> float:
    """全文一路的可信程度（0~1）：融合权重、混合分数与相关概率模型的匹配特征用同一个闸门。"""
    return lexical_gate(coverage, fusion.coverage_floor, fusion.coverage_full)


def _rerank(query: str, candidates: list[SearchResult], outcome: SearchOutcome, clock: _Clock) -> None:
    reranker = configured_reranker()
    if reranker is None:
        return  # RAG_RERANK_PROVIDER=none：按配置不重排，不算降级
    if not locally_available(reranker.provider, reranker.model):
        # 不在请求里下载几个 GB 的模型（不能联网时还要先等 hub 的重试，第一个检索曾因此等了 46~72 秒）：
        # 按重排序不可用处理，模型下载到本机（huggingface-cli download）之后自动用上
        logger.warning("rerank_model_not_local", reranker=reranker.breaker.name)
        outcome.degraded.append("rerank-unavailable")
        return
    with clock.stage("rerank"):
        try:
            scores = reranker.rerank(query, [c.chunk.text for c in candidates])
        except RerankUnavailable as exc:
            logger.warning("rerank_unavailable", error=str(exc), candidates=len(candidates))
            outcome.degraded.append("rerank-unavailable")
            return
    for candidate, score in zip(candidates, scores, strict=True):
        candidate.rerank_score = score
        candidate.score = score
    outcome.reranked = True


def _in_worker(fn: Callable[..., T], *args: Any) -> T:
    """在线程池里执行：像一次请求那样在前后回收过期或损坏的连接（本线程自己的连接）。"""
    close_old_connections()
    try:
        return fn(*args)
    finally:
        close_old_connections()


def _vector_path(kb: KnowledgeBase, request: SearchRequest, limit: int, plan: SearchPlan,
                 exclude: str) -> _PathResult:
    result = _PathResult()
    clock = _Clock(result.timings_ms)
    try:
        with clock.stage("embed"):
            # 问题先转成知识库分块的汉字写法（繁体问题问简体库时向量相似度普遍偏低，见 raglib.analysis.in_script）
            text = analysis.in_script(request.query, knowledge_base_script(kb.id))
            vector, result.cached = embed_query(kb.embedding_provider, kb.embedding_model, text)
            result.query_vector = vector
        with clock.stage("vector"):
            result.hits, result.method = vector_search(kb, vector, request.filters, limit, plan=plan,
                                                       exclude=exclude)
    except Exception as exc:
        result.failed = True
        logger.warning("search_path_failed", path="vector", error=str(exc), error_type=type(exc).__name__,
                       knowledge_base_id=str(kb.id))
    return result


def _fulltext_path(kb: KnowledgeBase, parsed: analysis.ParsedQuery, filters: SearchFilters, limit: int,
                   clock: _Clock) -> _PathResult:
    result = _PathResult()
    try:
        # 在外层事务里时用保存点：SQL 出错只回滚这一步，不污染外层事务。自动提交时不开事务：
        # 这里只有只读查询，BEGIN/COMMIT 只会多两次数据库往返（每个检索请求都有）
        savepoint = transaction.atomic() if transaction.get_connection().in_atomic_block else nullcontext()
        with clock.stage("fulltext"), savepoint:
            found = fulltext_search(kb, parsed, filters, limit)
        result.hits, result.coverage, result.scale = found.hits, found.coverage, found.scale
        result.statistics = found.statistics
    except Exception as exc:
        result.failed = True
        logger.error("search_path_failed", path="fulltext", error=str(exc), error_type=type(exc).__name__,
                     knowledge_base_id=str(kb.id))
    return result


def _attach_parents(results: list[SearchResult]) -> None:
    """子块结果带上父块文本；父块太长时只取命中子块周围 RAG_PARENT_WINDOW_CHARS 个字符。"""
    parents = load_parents([r.chunk.parent_id for r in results if r.chunk.parent_id is not None])
    for result in results:
        parent = parents.get(result.chunk.parent_id) if result.chunk.parent_id is not None else None
        if parent is None:
            continue
        text, metadata = parent
        offset = int(result.chunk.metadata.get("char_start", 0)) - int(metadata.get("char_start", 0))
        window, _ = context_window(text, offset, offset + len(result.chunk.text), settings.PARENT_WINDOW_CHARS)
        result.parent_chunk_id = result.chunk.parent_id
        result.parent_text = window


def context_order(results: list[SearchResult]) -> list[SearchResult]:
    """拼接上下文用的顺序（见 docs/INVARIANTS.md 的 CONTEXT-ORDER）：先按文档（上传先后），再按文中位置
    （字符起点，父块与子块可比；其次分块序号）。"""
    return sorted(results, key=lambda r: (r.chunk.document_created, str(r.chunk.document_id),
                                          int(r.chunk.metadata.get("char_start", 0)), r.chunk.chunk_index))
