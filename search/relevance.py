"""为一个知识库拟合相关概率模型：用它自己的分块造伪查询，走真实的检索服务收集每个候选的特征，
按“候选是否含出题的原句”做标签（同一篇文档的其他分块算部分相关，:data:`SAME_DOCUMENT_CREDIT`；占了库里一半分块的
文档除外，:data:`DOMINANT_SHARE`），
每种检索方式拟合一个逻辑回归（见 ``raglib.relevance``）。

- 留出两成伪查询自测：模型排序与原有排序的 MRR，以及 0.5 阈值下的精确率与召回率、拿掉答案后第一名的分数。
  混合方式的模型是全局校准之上的单调校准（见 ``raglib.relevance``），排序与全局校准相同，只换分数的尺度。
- 固定 ``seed`` 时结果确定：同一批分块、同一个种子，造出同样的题、拟合出同样的模型。
- 没有可检索分块（少于 ``MIN_CHUNKS``）的库不拟合，沿用全局校准参数。不到 ``SMALL_CHUNKS`` 块的小库另拿随包的
  外来问题检索一遍，结果全当反例（:func:`foreign_share`）；不到 ``MONOTONE_CHUNKS`` 块的汉字库全文方式只做单调的
  重新校准（``raglib.relevance.SMALL_MODE_FEATURES``；别的文字的库只到 ``SMALL_CHUNKS``）。
- 何时拟合（:func:`relevance_refresh`）：写入让还不到 30 块的库刚够拟合（1 块）或刚不算小库（5 块）时立即排一次
  （``documents.ingestion.copy_chunks``、``raglib.relevance.fit_on_write``），定时任务每分钟再检查一次：还没有模型
  而分块已经够了、或模型的做法过时，下一分钟就拟合；分块数比拟合时变了 ``REFIT_CHANGE`` 以上（大批摄取、删除之后）
  时重新拟合，但离上次拟合至少 ``REFIT_INTERVAL``：大批摄取期间不至于一分钟拟合一次——拟合时不到 30 块
  （``raglib.relevance.PROVISIONAL_CHUNKS``）的临时模型除外。分块数都按文档表上的 ``chunk_count`` 之和算（含父块，
  :func:`document_chunks`）。
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NamedTuple, TypeVar

import numpy as np
import structlog
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from documents.models import Document, DocumentChunk
from infra.locks import advisory_lock
from knowledge.models import KnowledgeBase
from raglib.analysis import text_script
from raglib.relevance import (
    DEFAULT_DROP_SHARE,
    MIN_CHUNKS,
    MODE_FEATURES,
    MODEL_REVISION,
    PROVISIONAL_CHUNKS,
    SMALL_CHUNKS,
    DropShare,
    PseudoQuery,
    RelevanceModel,
    ambiguous,
    candidate_features,
    fit_model,
    foreign_questions,
    pseudo_queries,
    reciprocal_rank,
    without,
)
from raglib.scoring import REFERENCE_THRESHOLD
from search import profiles, services
from search.models import RelevanceProfile

logger = structlog.get_logger(__name__)
_T = TypeVar("_T")

REFIT_CHANGE = 0.2
REFIT_INTERVAL = timedelta(minutes=10)
DEFAULT_QUERIES = 300
# 每种方式的伪查询是 DEFAULT_QUERIES（或 --queries）的几倍。混合方式的模型只有斜率与截距（全局校准的对数几率之上），
# 真实问题里许多相关结果的分数就在 0.5 上下，斜率差一点召回率就差很多：0.5 处的召回率在 10 个种子间，300 条时
# cmrc2018 标准差 0.037（最低 0.79）、squad 0.045（最低 0.73），900 条时都是 0.014（最低 0.83）。拟合时间随之变长
# （cmrc2018 约 20 → 75~90 s），只给最需要的混合方式（docs/EVALUATION.md）
QUERY_FACTORS: dict[str, int] = {"vector": 1, "fulltext": 1, "hybrid": 3}
# 每个伪查询取前 100 个候选（= 候选数上限）：拿到融合选出的全部候选，特征与排序无关
FIT_TOP_K = 100
VALIDATION_SHARE = 0.2
# 伪查询从原句里去掉的比例，按检索方式、按句子的文字分（``DropShare(汉字句去字, 其他文字去词)``）：
# 去得越多越像换了说法的真实提问，模型越肯接受字面重合少的结果。各方式的模型各自拟合、互不依赖，各用各的比例。
# - 混合方式的汉字句 0.55：0.35 时 cmrc2018 混合 0.5 处召回率 0.624 / 0.750 / 0.628（种子 0 / 1 / 2），
#   0.55 时 0.854 / 0.862 / 0.631——同条数、同种子比从不更低（900 条伪查询时两者都在 0.6 上下，差距小得多）。
#   英文句留 0.35：0.55 时 squad 混合召回率 0.904 / 0.815 / 0.864 → 0.654 / 0.374 / 0.030（英文去掉一半的词，
#   剩下的与原文几乎不重合，模型学成只信字面重合很多的结果）。
# - 全文留 0.35：0.55 时 squad 全文召回率 0.805 → 0.570。
# - 向量留 0.35：0.55 时精确率 / 召回率不升（squad 召回率 0.821 → 0.776），小库上别的话题的问题第一名反而更高
#   （均值最高 0.20 → 0.38）。docs/EVALUATION.md
DROP_SHARES: dict[str, DropShare] = {"vector": DEFAULT_DROP_SHARE, "fulltext": DEFAULT_DROP_SHARE,
                                     "hybrid": DropShare(han=0.55, other=DEFAULT_DROP_SHARE.other)}
# “拿掉答案”的变体（见 raglib.relevance.without）：每种方式每隔几条伪查询造一条、每条在拟合里算几条。它们全是
# 反例，越多模型越保守（无答案时第一名的分数越低，有答案时的召回率也越低）；变体由同一次检索的候选算出，不多花检索。
# - 全文与混合每 3 条造一条：每 2 条造一条时 cmrc2018 混合 0.5 处的召回率 0.595（当时）。
# - 向量每条都造、每条算 3 条：每 3 条造一条时，别的话题、别的语言的问题在中文库上的第一名均值 0.23、0.31（上限 0.2）
#   ——伪查询四分之三有答案，模型学到“第一名、比第 10 名高一点”就有约四分之一相关。每条算 3 条时 0.07 / 0.12，
#   cmrc2018、squad 0.5 处的召回率 0.915 → 0.836、0.818 → 0.717，精确率不降（docs/EVALUATION.md）


class Absent(NamedTuple):
    """一种方式的“拿掉答案”变体：每 ``every`` 条伪查询造一条，每条在拟合里算 ``weight`` 条。"""

    every: int
    weight: float


ABSENT: dict[str, Absent] = {"vector": Absent(1, 3.0), "fulltext": Absent(3, 1.0), "hybrid": Absent(3, 1.0)}
# 与出题分块同一篇文档的其他分块算“部分相关”，标签取这个值（含原句的分块为 1，其他文档的为 0）。评测与真实使用
# 都按文档判相关：长文里对的文章中不含原句的那段，对提问者也有用。只按原句判时向量方式的分数过于保守（squad 上
# 0.5 处召回率 0.548）；记 1 时模型把同文档都当答案（精确率 0.34），0.5 时混合方式的精确率 0.788，0.3 时三种方式
# 都在 0.8 / 0.6 以上，cmrc2018、toyhom 不变（docs/EVALUATION.md）
SAME_DOCUMENT_CREDIT = 0.3
# 一篇文档占了库里至少这个比例的可检索分块时，出自它的伪查询不给同文档的分块部分相关，只按分块判
# （:func:`same_document_credits`）。一本手册、一篇长文独占的库，或一份招标文件加几份附件：候选几乎全是同一篇，
# “同一篇文档”不再说明什么，记成部分相关反倒让模型学成“什么都有点相关”——一篇长文加三篇短文的库上（squad 的 14 篇
# 各配 3 篇短文），按答案偏移判相关时 0.5 处的精确率向量 .208、全文 .457、混合 .385，而只有那篇长文时是
# .839 / .760 / .650；独占的库以前三种方式一种也学不出（全部候选都“相关”，拿掉答案后一个不剩）。开发集里最大的
# 一篇占 14%（squad），拟合不受影响（docs/EVALUATION.md）
DOMINANT_SHARE = 0.5
# 小库（分块不到 raglib.relevance.SMALL_CHUNKS 个）拟合时另拿随包的外来问题（raglib.relevance.foreign_questions）
# 去检索，结果全当反例；这些问题合起来在拟合里算 FOREIGN_SHARES[方式] ÷ 分块数 倍伪查询的条数
# （:func:`foreign_share`）。这样的库伪查询少，拿掉答案的变体（ABSENT）要库里还剩别的分块，1 块的库一条也造不出：
# 模型不知道别的话题的问题会落在哪里。cmrc2018 的小库上（docs/EVALUATION.md“一两个分块的库”“小库的全文方式”）：
# - 向量与混合 10：1 块的库向量方式里别的话题的中文问题第一名均值 1 倍 0.51、3 倍 0.32、10 倍 0.165（召回率
#   1.00 → 0.86）；3~4 块的库 10 倍时召回率掉（混合 0.68 → 0.62），3 倍左右召回率不变、那个均值低三到四成——
#   所以按分块数摊；
# - 全文 0.3：外来问题与这么小的库很少有字面重合，匹配上的几条匹配程度都很低，分得很开；权重大了模型把界线推到
#   几乎照抄原文的伪查询那边，1 块的库 0.5 处召回率 10 倍 0.29、1 倍 0.43、0.3 倍 0.69、0.1 倍 0.91（那时别的话题的
#   问题第一名最高 0.215，0.3 倍 0.086）。
# 5 块起的库不用（开发集的模型不变）
FOREIGN_SHARES: dict[str, float] = {"vector": 10.0, "fulltext": 0.3, "hybrid": 10.0}
# 这样的库每句话出几条伪查询（每条随机去掉不同的字，raglib.relevance.pseudo_queries 的 ``variants``）：一块只有两三句话
# 的库只有两三条正例，对着一百个外来问题，逻辑回归的斜率被正则压住，问的正是它的问题也到不了 0.5（一篇产品说明
# 的 html，“怎么完成配置”向量 0.29）。cmrc2018 的小库上 1 条 → 3 条 → 5 条：混合方式 0.5 处召回率 0.71 → 0.77 → 0.80，
# 1 块的库向量 0.86 → 0.94 → 0.97，别的话题的问题第一名均值不变（≤ 0.166）；toyhom 的小库混合 0.18 → 0.38
FOREIGN_VARIANTS = 5


class _Batch(NamedTuple):
    """一批伪查询的做法：去字比例与条数。"""

    share: DropShare
    size: int


@dataclass
class _Examples:
    """一种方式在一批伪查询上的样本：每个查询的 (特征行, 相关程度 0~1)，按原有顺序；``absent`` 是拿掉相关结果
    （含部分相关的）后的同一批查询（全是反例，模拟库里没有答案的提问）。"""

    queries: list[tuple[list[dict[str, float]], list[float]]] = field(default_factory=list)
    absent: list[list[dict[str, float]]] = field(default_factory=list)
    # 外来问题（raglib.relevance.foreign_questions）在本库的检索结果：全是反例
    foreign: list[list[dict[str, float]]] = field(default_factory=list)

    def flat(self, absent_weight: float = 1.0, foreign_share: float = 0.0,
             ) -> tuple[list[dict[str, float]], list[float], list[float]]:
        """(特征行, 相关程度, 样本权重)：拿掉答案的变体每行算 ``absent_weight`` 行；外来问题合起来算
        ``foreign_share`` 倍伪查询的条数（:func:`foreign_share`）。"""
        rows = [row for query_rows, _ in self.queries for row in query_rows]
        labels = [label for _, query_labels in self.queries for label in query_labels]
        weights = [1.0] * len(rows)
        rows += [row for query_rows in self.absent for row in query_rows]
        weights += [absent_weight] * (len(rows) - len(weights))
        if self.foreign:
            rows += [row for query_rows in self.foreign for row in query_rows]
            weights += [foreign_share * len(self.queries) / len(self.foreign)] * (len(rows) - len(weights))
        return rows, labels + [0.0] * (len(rows) - len(labels)), weights


def foreign_share(chunks: int, mode: str) -> float:
    """分块数为 ``chunks`` 的库拟合 ``mode`` 方式时外来问题合起来算几倍伪查询的条数：:data:`FOREIGN_SHARES` ÷ 分块数，
    ``SMALL_CHUNKS`` 块起为 0（不用外来问题）。"""
    return FOREIGN_SHARES[mode] / chunks if chunks < SMALL_CHUNKS else 0.0


def same_document_credits(documents: Mapping[int, uuid.UUID]) -> dict[uuid.UUID, float]:
    """每篇文档的其他分块对出自它的伪查询算几分相关（``documents`` 是分块 id → 文档 id）：一般是
    :data:`SAME_DOCUMENT_CREDIT`；占了库里至少 :data:`DOMINANT_SHARE` 的分块的文档是 0，只按分块判。"""
    sizes = Counter(documents.values())
    return {document_id: 0.0 if size >= DOMINANT_SHARE * len(documents) else SAME_DOCUMENT_CREDIT
            for document_id, size in sizes.items()}


def label_for(query: PseudoQuery, document_id: uuid.UUID, text: str, documents: Mapping[int, uuid.UUID],
              credits: Mapping[uuid.UUID, float]) -> float:
    """候选对伪查询的相关程度：含出题原句为 1，与出题分块同一篇文档为该文档的部分相关（``credits``，
    :func:`same_document_credits`），否则 0。``documents`` 是分块 id → 文档 id。"""
    if query.sentence in text:
        return 1.0
    return credits.get(document_id, 0.0) if documents.get(query.source) == document_id else 0.0


def _collect(kb: KnowledgeBase, queries: Sequence[PseudoQuery], mode: services.Mode,
             documents: Mapping[int, uuid.UUID], credits: Mapping[uuid.UUID, float],
             foreign: Sequence[str] = ()) -> _Examples:
    examples = _Examples()
    profile = profiles.retrieval_profile(kb)
    for text in foreign:
        outcome = services.search(kb, services.SearchRequest(query=text, top_k=FIT_TOP_K, mode=mode,
                                                             rerank=False, return_parent=False))
        if outcome.results and not outcome.degraded:
            examples.foreign.append([r.features or {} for r in outcome.results])
    for index, query in enumerate(queries):
        outcome = services.search(kb, services.SearchRequest(query=query.text, top_k=FIT_TOP_K, mode=mode,
                                                             rerank=False, return_parent=False))
        if not outcome.results or outcome.degraded:
            continue
        # 恢复融合（或该路）原有的顺序：拟合用的特征与排序无关，自测要和原有排序比
        results = sorted(outcome.results, key=lambda r: (r.features or {}).get("fused_rank", 0.0))
        # 别的文章里有几乎同一句（raglib.relevance.NEAR_COPY）：这条题没有确定的答案，不学也不自测
        source_document = documents.get(query.source)
        if ambiguous(query.sentence, (r.chunk.text for r in results if r.chunk.document_id != source_document)):
            continue
        rows = [r.features or {} for r in results]
        labels = [label_for(query, r.chunk.document_id, r.chunk.text, documents, credits) for r in results]
        examples.queries.append((rows, labels))
        found = [label > 0 for label in labels]
        if index % ABSENT[mode].every == 0 and any(found) and not all(found):
            evidence = [r.relevance_evidence(rank) for rank, r in enumerate(results, start=1)]
            coverage = rows[0].get("coverage", 0.0)
            examples.absent.append(candidate_features(without(evidence, found), coverage=coverage,
                                                      depth=services.path_depth(FIT_TOP_K, mode),
                                                      gate=services.coverage_gate(coverage, profile.fusion),
                                                      calibration=profile.calibration))
    return examples


def _validation(model: RelevanceModel, held_out: _Examples) -> dict[str, float]:
    """留出伪查询上的自测：模型排序与原有排序的 MRR（按含原句的分块算），阈值 0.5 时前 10 条的精确率、召回率
    （部分相关的也算相关，与 ``manage.py evaluate`` 按文档判相关一致）。"""
    mrr_model = mrr_original = 0.0
    kept = kept_relevant = relevant = 0
    for rows, graded in held_out.queries:
        exact = [label >= 1.0 for label in graded]
        probabilities = [model.probability(row) for row in rows]
        order = sorted(range(len(rows)), key=lambda i: -probabilities[i])
        mrr_model += reciprocal_rank([exact[i] for i in order])
        mrr_original += reciprocal_rank(exact)
        for i in order[:10]:
            relevant += graded[i] > 0
            if probabilities[i] >= REFERENCE_THRESHOLD:
                kept += 1
                kept_relevant += graded[i] > 0
    count = max(len(held_out.queries), 1)
    # 拿掉答案之后的同一批查询：第一名的概率应当很低
    absent_top = [max(model.probability(row) for row in rows) for rows in held_out.absent if rows]
    foreign_top = [max(model.probability(row) for row in rows) for rows in held_out.foreign]
    return {"queries": len(held_out.queries), "mrr_model": round(mrr_model / count, 4),
            "mrr_original": round(mrr_original / count, 4),
            "precision": round(kept_relevant / kept, 4) if kept else 0.0,
            "recall": round(kept_relevant / relevant, 4) if relevant else 0.0,
            "absent_top1_mean": round(float(np.mean(absent_top)), 4) if absent_top else 0.0,
            "absent_top1_over_half": round(float(np.mean([p >= REFERENCE_THRESHOLD for p in absent_top])), 4)
            if absent_top else 0.0,
            **({"foreign_top1_mean": round(float(np.mean(foreign_top)), 4)} if foreign_top else {})}


def _held_out(items: Sequence[_T], seed: int) -> tuple[list[_T], list[_T]]:
    """按 ``seed`` 留出 :data:`VALIDATION_SHARE` 自测：(拟合用的, 自测用的)。条数相同的两批留出同样的下标。"""
    held = set(random.Random(seed).sample(range(len(items)), int(len(items) * VALIDATION_SHARE)))  # noqa: S311
    return [x for i, x in enumerate(items) if i not in held], [x for i, x in enumerate(items) if i in held]


def relevance_fit(*, kb: KnowledgeBase, queries: int = DEFAULT_QUERIES, seed: int = 0,
                  drop_shares: Mapping[str, DropShare] = DROP_SHARES) -> RelevanceProfile | None:
    """拟合并保存该知识库的相关概率模型；可检索分块少于 ``MIN_CHUNKS`` 时不拟合（删掉旧模型），返回 None。
    ``queries`` 是向量与全文方式的伪查询条数，每种方式是它的 :data:`QUERY_FACTORS` 倍（记下的 ``queries`` 是最多的
    那批）；``drop_shares`` 是每种方式的伪查询去字比例（缺的方式用 :data:`DROP_SHARES` 的）；比例与条数都相同的方式
    共用一批伪查询。"""
    stored = list(DocumentChunk.objects.filter(knowledge_base=kb, document__status=Document.Status.COMPLETED)
                  .exclude(role="parent").order_by("id").values_list("id", "chunk_text", "document_id"))
    chunks = [(chunk_id, text) for chunk_id, text, _ in stored]
    documents = {chunk_id: document_id for chunk_id, _, document_id in stored}
    if len(chunks) < MIN_CHUNKS:
        relevance_forget(kb=kb)
        return None
    credits = same_document_credits(documents)
    plans = {mode: _Batch(drop_shares.get(mode, DROP_SHARES[mode]), queries * QUERY_FACTORS[mode])
             for mode in MODE_FEATURES}
    small = len(chunks) < SMALL_CHUNKS
    # 汉字写法：记在模型上（借模型时比写法），也决定全文方式单调校准到多少块（raglib.relevance.mode_features）
    script = text_script(text for _, text in chunks)
    # 小库的句子少，每句出几条（FOREIGN_VARIANTS）；大库的句子够用，一句一条
    variants = FOREIGN_VARIANTS if small else 1
    # 比例与条数都相同的方式共用一批伪查询。每批各自留出两成：各批条数不同（混合方式的大三倍；去得多的那批里去完太短、
    # 不出题的句子多），条数相同的批留出同样的下标
    made = {plan: _held_out(pseudo_queries(chunks, plan.size, seed=seed, share=plan.share, variants=variants), seed)
            for plan in set(plans.values())}
    count = max(len(train) + len(test) for train, test in made.values())
    # 小库另用外来问题出反例（SMALL_CHUNKS），同样留出两成自测
    foreign_train, foreign_test = _held_out(foreign_questions() if small else (), seed)
    # 旧模型不影响拟合：每个伪查询取回融合选出的全部候选，特征与排序无关，自测前按融合名次恢复原有顺序
    mode_models: dict[str, dict[str, object]] = {}
    validation: dict[str, dict[str, float]] = {}
    for mode in MODE_FEATURES:
        plan = plans[mode]
        train, test = made[plan]
        fitted = _collect(kb, train, mode, documents, credits, foreign_train)  # type: ignore[arg-type]
        rows, labels, weights = fitted.flat(ABSENT[mode].weight, foreign_share(len(chunks), mode))
        if not any(labels) or all(labels):
            logger.warning("relevance_fit_skipped", knowledge_base_id=str(kb.id), mode=mode, reason="one class")
            continue
        model = fit_model(mode, rows, labels, weights, chunks=len(chunks), script=script)
        if model is None:
            logger.warning("relevance_fit_skipped", knowledge_base_id=str(kb.id), mode=mode, reason="not monotone")
            continue
        mode_models[mode] = model.as_dict()
        validation[mode] = {**_validation(model, _collect(kb, test, mode, documents, credits,  # type: ignore[arg-type]
                                                          foreign_test)),
                            "drop_share_han": plan.share.han, "drop_share_other": plan.share.other}
    with transaction.atomic():
        profile, _ = RelevanceProfile.objects.update_or_create(knowledge_base=kb, defaults={
            "embedding_model": profiles.embedding_model_key(kb), "mode_models": mode_models,
            "script": script, "chunk_count": len(chunks),
            "document_chunk_count": document_chunks(kb.id).get(kb.id, 0), "revision": MODEL_REVISION,
            "queries": count, "seed": seed, "validation": validation,
        })
    profiles.forget(kb.id)
    logger.info("relevance_fitted", knowledge_base_id=str(kb.id), queries=count, validation=validation)
    return profile


def relevance_forget(*, kb: KnowledgeBase) -> None:
    """删除该知识库的模型（回到全局校准参数）。"""
    RelevanceProfile.objects.filter(knowledge_base=kb).delete()
    profiles.forget(kb.id)


def document_chunks(only: uuid.UUID | None = None) -> dict[uuid.UUID, int]:
    """各知识库已完成文档的 ``chunk_count`` 之和（含父块；``only`` 给出时只算这一个库）：按文档表汇总，不数分块表
    （百万分块的库上数分块表是一次全表扫描）。"""
    documents = Document.objects.filter(status=Document.Status.COMPLETED)
    if only is not None:
        documents = documents.filter(knowledge_base_id=only)
    return dict(documents.values_list("knowledge_base_id")
                .annotate(total=Sum("chunk_count")).values_list("knowledge_base_id", "total"))


def profiles_due(only: uuid.UUID | None = None, *, settled: bool = False) -> list[KnowledgeBase]:
    """需要（重新）拟合的启用知识库（``only`` 给出时只看这一个）：还没有模型、模型的特征或拟合做法已过时
    （升级之后），或分块数变化两成以上、且离上次拟合已过 ``REFIT_INTERVAL``（拟合时不到
    :data:`raglib.relevance.PROVISIONAL_CHUNKS` 块的临时模型不等：4 块的库拟合之后又来了一块就不再用外来问题）。
    分块数是 :func:`document_chunks`，与拟合时记下的同一个和（``document_chunk_count``）相比。

    ``settled``：写入已经停了，要的是用全部分块学出的模型——分块数与拟合时有一点不同就拟合，不等（``manage.py
    evaluate`` 量的是稳态：摄取时库在第 1、第 5 块就拟合过，那之后“刚拟合过”）。"""
    fitted_profiles = RelevanceProfile.objects.all()
    enabled = KnowledgeBase.objects.filter(status=KnowledgeBase.Status.ENABLED)
    if only is not None:
        fitted_profiles = fitted_profiles.filter(knowledge_base_id=only)
        enabled = enabled.filter(id=only)
    counts = document_chunks(only)
    # 拟合时的分块数；为空的是记下这个数之前拟合的，它们的做法版本（revision）也旧，下面照样列为待重拟合
    fitted: dict[uuid.UUID, int | None] = {}
    outdated: set[uuid.UUID] = set()
    recent: set[uuid.UUID] = set()
    for kb_id, document_chunk_count, revision, mode_models, fitted_at in fitted_profiles.values_list(
            "knowledge_base_id", "document_chunk_count", "revision", "mode_models", "fitted_at"):
        fitted[kb_id] = document_chunk_count
        models = [RelevanceModel.from_dict(data) for data in mode_models.values()]
        # 拟合做法更新过的旧模型仍可用（查询时照用），但要重新拟合
        if revision != MODEL_REVISION or not all(profiles.current(model) for model in models):
            outdated.add(kb_id)
        if fitted_at > timezone.now() - REFIT_INTERVAL:
            recent.add(kb_id)
    due = []
    for kb in enabled.order_by("created_at"):
        chunks = counts.get(kb.id) or 0
        before = fitted.get(kb.id)
        if chunks < MIN_CHUNKS:
            continue
        if settled:
            changed = chunks != before
        else:
            changed = before is not None and abs(chunks - before) > REFIT_CHANGE * max(before, 1) and (
                kb.id not in recent or before < PROVISIONAL_CHUNKS)
        if before is None or kb.id in outdated or changed:
            due.append(kb)
    return due


def relevance_refresh(only: uuid.UUID | None = None, *, settled: bool = False) -> list[KnowledgeBase]:
    """为 :func:`profiles_due` 列出的知识库（``only``、``settled`` 的意思同它）逐个拟合；同一知识库同一时刻只有一个
    执行者（advisory lock，上一轮还没拟合完时这一轮跳过它）。返回拟合了的知识库。"""
    fitted = []
    for kb in profiles_due(only, settled=settled):
        with advisory_lock(f"relevance:{kb.id}") as acquired:
            if acquired and relevance_fit(kb=kb) is not None:
                fitted.append(kb)
    return fitted
