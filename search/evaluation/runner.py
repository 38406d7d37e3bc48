"""评测的执行：把数据集经真实的上传与摄取路径写入新知识库，再对每种检索方式跑全部问题并计算指标。

摄取在本进程内同步执行（django-q2 的 sync 模式），不依赖正在运行的 worker，结果可复现；检索直接调用
检索服务（与 POST /search 相同的代码路径，少了 HTTP 与序列化），取前 100 条。
"""

from __future__ import annotations

import bisect
import io
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db.models import Count
from django_q.conf import Conf

from documents.ingestion import draft_chunks, embedding_input
from documents.models import Document, DocumentChunk
from documents.sandbox import parse_limits
from documents.services import document_upload
from infra.principal import SYSTEM_PRINCIPAL
from knowledge.models import KnowledgeBase
from knowledge.options import chunking_options
from knowledge.services import knowledge_base_create, knowledge_base_delete
from raglib.evaluation.dataset import Dataset, Query, Unit
from raglib.evaluation.metrics import (
    answer_hit_at_k,
    mrr_at_k,
    ndcg_at_k,
    percentile,
    recall_at_k,
)
from raglib.evaluation.reference import ReferenceIndex
from raglib.parsing import parse_document
from raglib.providers.embedding import EmbeddingProvider
from raglib.scoring import REFERENCE_THRESHOLD
from search import profiles, segments, services
from search.evaluation.embedding_cache import embedding_cache, prefill
from search.query_embeddings import clear_query_embeddings
from search.relevance import relevance_refresh

# 评测方式 → (检索方式, 是否重排序)
MODES: dict[str, tuple[services.Mode, bool]] = {
    "vector": ("vector", False),
    "fulltext": ("fulltext", False),
    "hybrid": ("hybrid", False),
    "hybrid+rerank": ("hybrid", True),
}
# 参照 BM25：不走检索服务，在同一批分块上用 Python 算（见 raglib.evaluation.reference）
REFERENCE_MODE = "bm25-reference"
TOP_K = 100
METRIC_COLUMNS = ("ndcg@10", "recall@10", "recall@100", "mrr@10", "answer_hit@1", "answer_hit@5", "answer_hit@10")

Progress = Callable[[Sequence[Any], str], Any]


def no_progress(items: Sequence[Any], description: str) -> Sequence[Any]:
    return items


@dataclass(frozen=True)
class EvaluationConfig:
    chunking: str = "token"
    embedding_provider: str | None = None
    embedding_model: str | None = None
    modes: tuple[str, ...] = (*MODES, REFERENCE_MODE)
    keep: bool = False
    # 附加问题集：名称 → 问题（与主问题集共用 qrels，例如同一批问题的另一种语言版本）
    query_sets: dict[str, list[Query]] = field(default_factory=dict)
    # 查询向量也走磁盘缓存：反复评测时省掉模型时间（此时延迟不含查询向量化）
    cache_query_embeddings: bool = False
    # 无关问题（另一个话题、另一种语言）：名称 → 问题文本；库里没有它们的答案，看每种方式第一名的分数有多低
    unrelated: dict[str, list[str]] = field(default_factory=dict)
    # 不替知识库拟合相关概率模型：量新库在定时任务第一次拟合之前的分数（借同模型的库，或全局校准）
    unfitted: bool = False


# 分数出自哪里（报告里的说明）
SCORE_SOURCES = {
    "own": "本库自己的相关概率模型",
    "borrowed": "借同一 embedding 模型的另一个库的相关概率模型（本库还没有自己的）",
    "global": "全局校准参数（本库与同模型的库都还没有相关概率模型）",
}


@dataclass
class ModeReport:
    mode: str
    queries: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    degraded_queries: int = 0
    skipped: str = ""
    per_query: list[dict[str, Any]] = field(default_factory=list)
    # 前 10 条结果的 (对外分数, 是否标注相关)：衡量一个固定阈值能否把相关与不相关分开
    score_pairs: list[tuple[float, bool]] = field(default_factory=list)
    separation: dict[str, float] = field(default_factory=dict)


@dataclass
class EvaluationReport:
    dataset: str
    level: str
    chunking: str
    embedding: dict[str, Any]
    knowledge_base: dict[str, Any]
    ingest_seconds: float
    modes: list[ModeReport]
    total_seconds: float = 0.0
    # 无关问题上各方式第一名的分数：{名称: {方式: {"queries", "top1_mean", "top1_p95", "over_0.2", "over_0.5"}}}
    unrelated: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # 延迟是否含查询向量化：--cache-query-embeddings 时查询向量在计时之前就全部算好（各方式口径一致，都不含）
    latency_includes_query_embedding: bool = True
    # 分数出自哪个相关概率模型（``search.profiles.ORIGINS`` 之一，说明见 :data:`SCORE_SOURCES`），
    # 以及本次为它拟合用了多少秒（没拟合为 0）
    score_source: str = "global"
    fit_seconds: float = 0.0
    # 有模型（本库的或借来的）时，其中没有这种方式的模型、这种方式仍用全局校准的那些（伪查询只有一类，或学不出
    # 单调的模型）
    global_modes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset, "level": self.level, "chunking": self.chunking, "embedding": self.embedding,
            "knowledge_base": self.knowledge_base, "ingest_seconds": round(self.ingest_seconds, 1),
            "total_seconds": round(self.total_seconds, 1),
            "latency_includes_query_embedding": self.latency_includes_query_embedding,
            "score_source": self.score_source, "fit_seconds": round(self.fit_seconds, 1),
            "global_modes": self.global_modes,
            "unrelated": self.unrelated,
            "modes": {m.mode: {"queries": m.queries, "skipped": m.skipped or None, "degraded_queries":
                               m.degraded_queries, **{k: round(v, 4) for k, v in m.metrics.items()},
                               "latency_ms": {k: round(v, 1) for k, v in m.latency_ms.items()},
                               "score_separation": {k: round(v, 4) for k, v in m.separation.items()}}
                      for m in self.modes},
        }

    def per_query_dict(self) -> dict[str, Any]:
        """逐题结果：方式 → [每个问题一条]。"""
        return {"dataset": self.dataset, "level": self.level,
                "modes": {m.mode: m.per_query for m in self.modes if not m.skipped}}

    def markdown(self) -> str:
        columns = METRIC_COLUMNS
        lines = [
            f"{self.dataset}（{self.level} 级，{self.chunking} 分块，{self.embedding['provider']}:"
            f"{self.embedding['model']}；{self.knowledge_base['documents']} 篇文档 / {self.knowledge_base['chunks']}"
            f" 个分块，摄取 {self.ingest_seconds:.0f} s）",
            "",
            "延迟是检索服务的耗时（不含 HTTP），" + ("含查询向量化（每种方式开始前清空查询向量缓存）。"
                                                  if self.latency_includes_query_embedding else
                                                  "不含查询向量化（查询向量在计时前已全部算好，各方式口径相同）。"),
            "",
            f"分数：{SCORE_SOURCES[self.score_source]}"
            + (f"（本次拟合 {self.fit_seconds:.0f} s）" if self.fit_seconds else "")
            + (f"；{'、'.join(self.global_modes)} 方式没有学出模型（伪查询学不出），用全局校准参数"
               if self.global_modes else ""),
            "",
            "| 方式 | 问题数 | nDCG@10 | Recall@10 | Recall@100 | MRR@10 | hit@1 | hit@5 | hit@10 | p50 ms | p95 ms |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for report in self.modes:
            if report.skipped:
                lines.append(f"| {report.mode} | — | {report.skipped} |" + " |" * 8)
                continue
            values = " | ".join(f"{report.metrics[c]:.3f}" for c in columns)
            note = f"（{report.degraded_queries} 次降级）" if report.degraded_queries else ""
            lines.append(f"| {report.mode}{note} | {report.queries} | {values} | {report.latency_ms['p50']:.1f} | "
                         f"{report.latency_ms['p95']:.1f} |")
        scored = [r for r in self.modes if r.separation and not r.skipped and not r.mode.startswith(REFERENCE_MODE)]
        if scored:
            threshold = scored[0].separation["threshold"]
            lines += ["", f"对外分数的可分性（前 10 条结果，阈值 {threshold:g}）", "",
                      "| 方式 | 精确率 | 召回率 | 保留比例 | AUC |", "|---|---|---|---|---|"]
            lines += [f"| {r.mode} | {r.separation['precision']:.3f} | {r.separation['recall']:.3f} | "
                      f"{r.separation['kept_share']:.3f} | {r.separation.get('auc', float('nan')):.3f} |"
                      for r in scored]
        for name, by_mode in self.unrelated.items():
            lines += ["", f"无关问题 {name}（库里没有答案）上第一名的分数", "",
                      "| 方式 | 问题数 | 均值 | p95 | > 0.2 的比例 | ≥ 0.5 的比例 |", "|---|---|---|---|---|---|"]
            lines += [f"| {mode} | {v['queries']:.0f} | {v['top1_mean']:.3f} | {v['top1_p95']:.3f} | "
                      f"{v['over_0.2']:.3f} | {v['over_0.5']:.3f} |" for mode, v in by_mode.items()]
        return "\n".join(lines)


def unrelated_top_scores(kb: KnowledgeBase, texts: Sequence[str], modes: Sequence[str],
                         progress: Progress = no_progress, label: str = "") -> dict[str, dict[str, float]]:
    """无关问题上每种方式第一名的分数（没有结果记 0）：分数可信的话，它们都应当很低。"""
    out: dict[str, dict[str, float]] = {}
    for mode in modes:
        if mode not in MODES or MODES[mode][1]:
            continue  # 参照 BM25 没有对外分数；重排序的分数另有来源
        search_mode, _ = MODES[mode]
        top = []
        for text in progress(list(texts), f"{mode}@{label}"):
            outcome = services.search(kb, services.SearchRequest(query=text, top_k=1, mode=search_mode, rerank=False))
            top.append(outcome.results[0].score if outcome.results else 0.0)
        out[mode] = {"queries": len(top), "top1_mean": sum(top) / max(len(top), 1),
                     "top1_p95": percentile(top, 95), "over_0.2": sum(s > 0.2 for s in top) / max(len(top), 1),
                     "over_0.5": sum(s >= 0.5 for s in top) / max(len(top), 1)}
    return out


def _modes_without_model(kb: KnowledgeBase, modes: Sequence[str]) -> list[str]:
    """知识库有模型时，所评的方式里没有对应模型（仍用全局校准）的那些；没有任何模型时为空（报告已写明全局校准）。"""
    if profiles.model_origin(kb.id) == "global":
        return []
    search_modes = dict.fromkeys(MODES[mode][0] for mode in modes if mode in MODES and not MODES[mode][1])
    return [mode for mode in search_modes if profiles.relevance_model(kb.id, mode) is None]


def score_separation(pairs: Sequence[tuple[float, bool]], threshold: float) -> dict[str, float]:
    """一个阈值把前 10 条结果分成“返回 / 不返回”时的精确率与召回率（相对标注相关的那些），以及 ROC AUC
    （随机取一条相关、一条不相关，相关那条分数更高的概率；与阈值无关）。"""
    relevant = sorted(score for score, label in pairs if label)
    other = sorted(score for score, label in pairs if not label)
    kept = [label for score, label in pairs if score >= threshold]
    result = {"threshold": threshold,
              "precision": sum(kept) / len(kept) if kept else 0.0,
              "recall": sum(kept) / len(relevant) if relevant else 0.0,
              "kept_share": len(kept) / len(pairs) if pairs else 0.0}
    if relevant and other:
        # Mann-Whitney：对每个相关分数数出比它低（同分记半个）的不相关分数
        wins = sum(bisect.bisect_left(other, score) + (bisect.bisect_right(other, score)
                                                        - bisect.bisect_left(other, score)) / 2
                   for score in relevant)
        result["auc"] = wins / (len(relevant) * len(other))
    return result


def compare_reports(old: dict[str, Any], new: dict[str, Any]) -> str:
    """两次 ``--output`` 报告的差值表（新 - 旧，单位：点 = 0.01）；只比两边都有的方式。"""
    lines = ["与旧报告的差值（新 - 旧，乘以 100）", "",
             "| 方式 | " + " | ".join(METRIC_COLUMNS) + " |", "|---|" + "---|" * len(METRIC_COLUMNS)]
    for mode, values in new["modes"].items():
        before = old["modes"].get(mode)
        if not isinstance(before, dict) or values.get("skipped") or before.get("skipped"):
            continue
        deltas = [f"{(values[c] - before[c]) * 100:+.1f}" if c in values and c in before else "—"
                  for c in METRIC_COLUMNS]
        lines.append(f"| {mode} | " + " | ".join(deltas) + " |")
    return "\n".join(lines)


@contextmanager
def synchronous_tasks() -> Iterator[None]:
    """摄取任务在本进程内同步执行（不需要 worker），结束后恢复原设置。"""
    previous = Conf.SYNC
    Conf.SYNC = True
    try:
        yield
    finally:
        Conf.SYNC = previous


def _filename(unit_id: str) -> str:
    return re.sub(r"[^\w.-]", "_", unit_id)[:200] + ".md"


def ingest(dataset: Dataset, config: EvaluationConfig, progress: Progress = no_progress) -> KnowledgeBase:
    """每个单元作为一份 Markdown 文档（``# 标题`` + 正文）上传；元数据 ``eval_id`` 把分块映射回单元 id。"""
    embedding = {key: value for key, value in (("provider", config.embedding_provider),
                                                ("model", config.embedding_model)) if value}
    kb = knowledge_base_create(
        principal=SYSTEM_PRINCIPAL, name=f"eval-{dataset.name}-{dataset.level}-{config.chunking}-{time.time_ns()}",
        description="manage.py evaluate", embedding=embedding or None, chunking={"strategy": config.chunking},
    )
    bodies = [(unit, f"# {unit.title}\n\n{unit.text}" if unit.title else unit.text) for unit in dataset.units]
    with embedding_cache(kb.embedding_provider, kb.embedding_model) as provider, synchronous_tasks():
        prefill(provider, embedding_inputs(kb, bodies, provider, progress), progress)
        for unit, body in progress(bodies, "摄取"):
            document_upload(kb=kb, filename=_filename(unit.id), upload=io.BytesIO(body.encode("utf-8")),
                            metadata={"eval_id": unit.id, "title": unit.title}, chunking={})
    # 量稳态下的知识库：服务在写入停下 RAG_FULLTEXT_IDLE_MERGE_MINUTES 之内自己会合并 L0、并段、缩回 L0；
    # 不整理时量到的是摄取刚结束、几个段加一截 L0 的样子（排序相同，延迟与数据库大小偏大）
    for _ in progress([kb.id], "整理全文索引"):
        segments.settle(kb.id)
    return kb


def fit_when_due(kb: KnowledgeBase, progress: Progress = no_progress) -> float:
    """像服务那样替知识库拟合相关概率模型，返回用时（秒）：还没有、已过时，或不是用现在的全部分块拟合的（摄取时库在
    第 1、第 5 块就拟合过；服务在写入停下之后也会用全部分块重新拟合，评测量的是那时的稳态）。

    服务在摄取后几秒到一两分钟之内就会拟合（``ops.tasks.refresh_relevance_profiles``）；评测不拟合时量到的
    是新库在那之前借来的分数（同模型的另一个库，或全局校准），与用户稳态下拿到的分数不同——别的机器上新建的评测库
    往往一个同模型的库都没有，向量方式的分数就一条也到不了 0.5。"""
    started = time.perf_counter()
    for _ in progress([kb.id], "拟合相关概率模型"):
        relevance_refresh(only=kb.id, settled=True)
    return time.perf_counter() - started


def embedding_inputs(kb: KnowledgeBase, bodies: Sequence[tuple[Unit, str]], provider: EmbeddingProvider,
                     progress: Progress = no_progress) -> list[str]:
    """每份文档经摄取流水线会送去 embedding 的文本，用流水线自己的解析、分块与 ``embedding_input`` 算出，
    供预计算按大批次一次算好（摄取时逐个文档调用模型，cmrc2018 这样一篇一两块的库批大小只有 1）。

    以前预算的是整篇文档与正文本身：多分块的长文档里它们从来不是分块文本，白算了一遍整个语料。
    semantic 分块在分块时就要向量，这里不预算。
    """
    if chunking_options(kb.chunking, {}).strategy == "semantic":
        return []
    texts: list[str] = []
    with tempfile.TemporaryDirectory() as directory:
        for unit, body in progress(bodies, "分块（预计算向量用）"):
            path = Path(directory) / _filename(unit.id)
            path.write_text(body, encoding="utf-8")
            parsed = parse_document(path, filename=path.name, ocr=None, limits=parse_limits())
            texts.extend(embedding_input(draft) for draft in draft_chunks(kb, {}, parsed.markdown, provider)
                         if draft.role != "parent")
    return texts


def _query_metrics(ranked: Sequence[str], texts: Sequence[str], query: Query,
                   qrels: dict[str, int]) -> dict[str, float]:
    return {
        "ndcg@10": ndcg_at_k(ranked, qrels, 10),
        "recall@10": recall_at_k(ranked, qrels, 10),
        "recall@100": recall_at_k(ranked, qrels, 100),
        "mrr@10": mrr_at_k(ranked, qrels, 10),
        **{f"answer_hit@{k}": answer_hit_at_k(texts, query.answers, k) for k in (1, 5, 10)},
    }


def _record(report: ModeReport, query: Query, qrels: dict[str, int], ranked: Sequence[str],
            texts: Sequence[str], scores: Sequence[float], features: list[list[float | None]] | None = None) -> None:
    """累计一个问题的指标，并留下逐题记录（失败分析用：前 10 名、第一个相关结果的名次与分数）。"""
    values = _query_metrics(ranked, texts, query, qrels)
    for name, value in values.items():
        report.metrics[name] = report.metrics.get(name, 0.0) + value
    first = next((rank for rank, unit in enumerate(ranked, start=1) if qrels.get(unit, 0) > 0), None)
    report.per_query.append({
        "query_id": query.id, **{name: round(value, 4) for name, value in values.items()},
        "first_relevant_rank": first, "top10": list(ranked[:10]),
        "top10_scores": [round(score, 4) for score in scores[:10]],
        **({"top10_features": features[:10]} if features else {}),
    })
    report.score_pairs.extend((score, qrels.get(unit, 0) > 0) for unit, score in zip(ranked[:10], scores[:10],
                                                                                     strict=False))
    report.queries += 1


def _finish(report: ModeReport, latencies: Sequence[float]) -> ModeReport:
    report.metrics = {name: total / report.queries for name, total in report.metrics.items()}
    report.separation = score_separation(report.score_pairs, REFERENCE_THRESHOLD)
    report.latency_ms = {"p50": percentile(latencies, 50), "p95": percentile(latencies, 95)}
    return report


def _best_per_unit(results: Sequence[services.SearchResult]) -> dict[str, services.SearchResult]:
    """分块 → 单元 id（同一单元只留最好名次那个分块），顺序即名次。"""
    best: dict[str, services.SearchResult] = {}
    for result in results:
        best.setdefault(str(result.chunk.metadata.get("eval_id", "")), result)
    return best


def evaluate_mode(kb: KnowledgeBase, dataset: Dataset, mode: str, progress: Progress = no_progress,
                  queries: Sequence[Query] | None = None, label: str | None = None) -> ModeReport:
    """对每个问题走检索服务（与 POST /search 同一路径），``queries`` 覆盖数据集的问题（跨语言等问题集）。"""
    search_mode, rerank = MODES[mode]
    report = ModeReport(label or mode)
    # 每种方式从冷的查询向量缓存开始：否则后跑的方式命中前面留下的缓存，延迟不可比
    clear_query_embeddings()
    latencies: list[float] = []
    for query in progress(queries or dataset.queries, report.mode):
        request = services.SearchRequest(query=query.text, top_k=TOP_K, mode=search_mode, rerank=rerank)
        started = time.perf_counter()
        outcome = services.search(kb, request)
        latencies.append((time.perf_counter() - started) * 1000)
        if rerank and not outcome.reranked and "rerank-unavailable" not in outcome.degraded:
            report.skipped = "未配置重排序（RAG_RERANK_PROVIDER=none）"
            return report
        report.degraded_queries += bool(outcome.degraded)
        best = _best_per_unit(outcome.results)
        texts = [r.parent_text or r.chunk.text for r in outcome.results]
        _record(report, query, dataset.qrels[query.id], list(best), texts, [r.score for r in best.values()],
                [list(r.evidence) if r.evidence else [r.vector_similarity, r.fulltext_unit] for r in best.values()])
    return _finish(report, latencies)


def evaluate_reference(kb: KnowledgeBase, dataset: Dataset, progress: Progress = no_progress,
                       queries: Sequence[Query] | None = None, label: str = REFERENCE_MODE) -> ModeReport:
    """参照 BM25（:mod:`raglib.evaluation.reference`）在同一批可检索分块上的结果，指标口径与各方式相同。"""
    report = ModeReport(label)
    chunks = {chunk_id: (text, str(metadata.get("eval_id", ""))) for chunk_id, text, metadata in
              DocumentChunk.objects.filter(knowledge_base=kb, document__status=Document.Status.COMPLETED)
              .exclude(role="parent").values_list("id", "chunk_text", "metadata")}
    index = ReferenceIndex.build((chunk_id, text) for chunk_id, (text, _) in chunks.items())
    latencies: list[float] = []
    for query in progress(queries or dataset.queries, report.mode):
        started = time.perf_counter()
        hits = index.search(query.text, TOP_K)
        latencies.append((time.perf_counter() - started) * 1000)
        # 同一单元的多个分块只取最好名次：与 dedupe 相同，分数跟着第一次出现的位置走
        seen: dict[str, float] = {}
        for chunk_id, score in hits:
            seen.setdefault(chunks[chunk_id][1], score)
        _record(report, query, dataset.qrels[query.id], list(seen), [chunks[c][0] for c, _ in hits],
                list(seen.values()))
    return _finish(report, latencies)


def _evaluate_all(kb: KnowledgeBase, dataset: Dataset, config: EvaluationConfig,
                  progress: Progress) -> list[ModeReport]:
    """主问题集与每个附加问题集（``名称=文件``，如跨语言问题）各跑一遍全部方式与参照 BM25。"""
    reports = []
    for name, queries in [("", None), *config.query_sets.items()]:
        suffix = f"@{name}" if name else ""
        for mode in config.modes:
            if mode == REFERENCE_MODE:
                reports.append(evaluate_reference(kb, dataset, progress, queries, label=mode + suffix))
            else:
                reports.append(evaluate_mode(kb, dataset, mode, progress, queries, label=mode + suffix))
    return reports


def run_evaluation(dataset: Dataset, config: EvaluationConfig, progress: Progress = no_progress,
                   kb: KnowledgeBase | None = None) -> EvaluationReport:
    """摄取（或复用 ``kb``）→ 逐个方式检索并计算指标 → 除非 ``keep`` 否则删除知识库。"""
    started = time.perf_counter()
    reuse = kb is not None
    if kb is None:
        kb = ingest(dataset, config, progress)
    ingest_seconds = time.perf_counter() - started
    fit_seconds = 0.0 if config.unfitted else fit_when_due(kb, progress)
    try:
        statuses = dict(Document.objects.filter(knowledge_base=kb).values_list("status")
                        .annotate(count=Count("id")).values_list("status", "count"))
        with embedding_cache(kb.embedding_provider, kb.embedding_model,
                             queries=config.cache_query_embeddings) as provider:
            if config.cache_query_embeddings:
                # 计时之前把全部问题的向量算好：否则第一种用到向量的方式替后面的方式付了模型时间，延迟口径不一
                texts = [q.text for queries in (dataset.queries, *config.query_sets.values()) for q in queries]
                texts += [text for unrelated in config.unrelated.values() for text in unrelated]
                for text in progress(list(dict.fromkeys(texts)), "预计算查询向量"):
                    provider.embed_query(text)
            reports = _evaluate_all(kb, dataset, config, progress)
            unrelated = {name: unrelated_top_scores(kb, texts, config.modes, progress, name)
                         for name, texts in config.unrelated.items()}
        report = EvaluationReport(
            dataset=dataset.name, level=dataset.level, chunking=config.chunking,
            embedding={"provider": kb.embedding_provider, "model": kb.embedding_model,
                       "dimension": kb.embedding_dimension},
            knowledge_base={"id": str(kb.id), "name": kb.name, "kept": config.keep or reuse,
                            "documents": statuses.get(Document.Status.COMPLETED, 0),
                            "failed_documents": statuses.get(Document.Status.FAILED, 0),
                            "chunks": DocumentChunk.objects.filter(knowledge_base=kb).exclude(role="parent").count()},
            ingest_seconds=0.0 if reuse else ingest_seconds, modes=reports,
            latency_includes_query_embedding=not config.cache_query_embeddings, unrelated=unrelated,
            score_source=profiles.model_origin(kb.id), fit_seconds=fit_seconds,
            global_modes=_modes_without_model(kb, config.modes),
        )
    finally:
        if not (config.keep or reuse):
            with synchronous_tasks():
                knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)
    report.total_seconds = time.perf_counter() - started
    return report
