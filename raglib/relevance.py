"""不用标注、按知识库学出来的相关概率：伪查询 → 检索 → 每个候选的特征 → 逻辑回归 → P(相关)。

为什么按知识库学：余弦相似度的整体水平因 embedding 模型而异，BM25 匹配程度的分布因语料（长文、短问答、
中文、英文）而异；在两个开发集上拟合的一组全局常数搬到别的库上就不准（向量方式在新库上一条都到不了 0.5）。
每个知识库有自己的分块，用它们造题自测，就能在不要任何标注的情况下学出“在这个库、这个模型上，什么样的证据
意味着相关”。

- 伪查询（:func:`pseudo_queries`）：从分块里抽一句话，随机去掉一部分字（中文）或词（其他文字），比例按句子的
  文字分（:class:`DropShare`），模仿“问题与原文部分重合”的真实提问；这句话原文出现在哪些分块里，哪些分块就是它的
  相关结果（相邻分块的重叠部分也算，避免把真相关当成反例）。去完剩下的太少的句子不出题（:data:`MIN_KEPT_HAN`），
  别的文章里有几乎同一句的不用（:func:`ambiguous`：没有确定的答案）。
- 特征（:func:`candidate_features`）：余弦相似度、BM25 匹配程度（0~1）、各自相对本查询最好那条的差或比例、
  在两路里的名次（取对数）、查询在本库的覆盖率、两路是否都找到它。差值特征让概率跨查询可比：同样 0.85 的余弦，
  在最好只有 0.86 的查询里和在最好有 0.95 的查询里意义不同。
- 模型（:class:`RelevanceModel`）：特征标准化后的 L2 逻辑回归，牛顿法拟合（:func:`fit_logistic`），
  每种检索方式一个（只用该方式有的特征），所以三种方式的分数含义相同。混合方式的模型只在全局校准的对数几率上
  做单调的重新校准：名次不变，分数换成本库的尺度（BGE-M3 的余弦整体比 e5 低得多，按 e5 拟合的全局常数给它打分，
  相关的结果也到不了 0.5）。

全是纯函数与数据类，不碰数据库；造题与拟合的编排在 ``search.relevance``。
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raglib.chunking.sentences import split_sentences
from raglib.scoring import Calibration, fulltext_logit, hybrid_logit

# 牛顿法的 L2（作用在标准化后的特征上）：伪查询有几千个候选，这个量级只防完全可分时发散，不压制真实的权重
L2 = 1.0

# similarity_lift 的参照名次：相似度减去第 LIFT_RANK 名的相似度
LIFT_RANK = 10

# 各检索方式用到的特征（顺序即模型权重的顺序）
MODE_FEATURES: dict[str, tuple[str, ...]] = {
    "vector": ("similarity", "similarity_gap", "similarity_lift", "vector_rank"),
    "fulltext": ("match", "match_share", "fulltext_rank", "coverage"),
    # 混合方式只有一个特征：全局校准的对数几率（两路各自的证据按固定权重合起来）。在它上面学的是单调的重新校准：
    # 排序与全局校准完全相同，只有分数换成本库（本模型）的尺度。让模型自己学两路的权重时它偏信全文一路——伪查询
    # 是原文去字，字面重合多——在换了说法的真实问题上排序变差（docs/EVALUATION.md）；单调的校准不改名次，不会。
    "hybrid": ("calibrated",),
}
# 分块不到 MONOTONE_CHUNKS 个的汉字库（别的文字的库不到 SMALL_CHUNKS 个，见 :func:`mode_features`），全文方式也只在
# 全局校准之上做单调的重新校准（一个特征：全局全文曲线的对数几率）。
# 这么小的库里 BM25 的 IDF 失真：1 块的库里库里有的词 df = N，IDF 只有库里没有的词的五分之一，匹配程度（BM25 分 ÷
# 可能的最高分）整体偏低，全局曲线给问的正是它的问题 0.01~0.16。名次在这样的库里本来就对（相关与不相关的分数差着
# 一两个数量级），差的只是尺度；四个特征的模型在几十条伪查询上学出来的却是“伪查询那样几乎照抄原文才相关”
# （1~4 块召回率 0.03~0.24，6~26 块 0.48~0.64）。单调的校准只挪尺度，不改名次（docs/EVALUATION.md）
SMALL_MODE_FEATURES: dict[str, tuple[str, ...]] = {"fulltext": ("fulltext_calibrated",)}
# 拟合做法的版本：1 = 权重符号受约束、同文档的分块算部分相关（search.relevance.SAME_DOCUMENT_CREDIT）；
# 2 = 混合方式的伪查询在汉字句里去掉更多的字（search.relevance.DROP_SHARES）；
# 3 = 去完剩下的太少的句子不出题（MIN_KEPT_HAN），别的文章里有几乎同一句的不用（NEAR_COPY）；
# 4 = 向量方式每条伪查询都造拿掉答案的变体、每条算 3 条（search.relevance.ABSENT）；
# 5 = 只有一篇文档的库按分块判相关（search.relevance.same_document_credit）：以前这样的库三种方式都学不出，升级后
#     重新拟合一遍才有模型（别的库拟合出的模型与 4 相同，只是重算一次）；
# 6 = 推广到占了库里至少一半分块的文档（search.relevance.DOMINANT_SHARE）：一份长文加几篇短文的库，出自长文的伪查询
#     也按分块判（一篇文档的库与文档都不到一半的库拟合出的模型与 5 相同）；
# 7 = 不到 MONOTONE_CHUNKS 块的库的全文方式是全局校准之上的单调校准（SMALL_MODE_FEATURES）。以前 1~4 块的库没有
#     全文方式的模型，5~99 块的用四个特征的模型，升级后重新拟合一遍（100 块起的库拟合出的模型与 6 相同）；
# 8 = 界线从 100 块挪到 200 块：100~199 块的汉字库的全文方式换成单调校准；覆盖率按至少 100 块的库算 IDF
#     （raglib.bm25.COVERAGE_MIN_CHUNKS），不到 100 块的库里闸门与覆盖率特征的取值变了。升级后重新拟合一遍
#     （200 块起的库拟合出的模型与 7 相同）；
# 9 = 字母、数字的词在不到 20 块的库里按至少 20 块算 BM25 的 IDF（raglib.bm25.WORD_IDF_MIN_CHUNKS）：这样的库里
#     全文的分数与名次变了，升级后重新拟合一遍（20 块起的库拟合出的模型与 8 相同）；
# 10 = 混合方式的全局校准对数几率里加上查询词的邻近程度（raglib.proximity，只算不带汉字词的查询）：英文等库的混合
#     模型要在新的对数几率上重新拟合，否则英文问题的分数整体偏高（汉字库拟合出的模型与 9 相同）；
# 11 = 邻近程度的“一句”换成分块器的句子（硬换行、e.g. 这类缩写不断句）：英文等库的混合模型重新拟合一遍
#     （汉字库拟合出的模型与 10 相同）；
# 12 = 伪查询的“一句”也换成分块器的句子（_sentences）：硬换行的正文（PDF）以前出的是一行的片段，引号里的句末、
#     e.g. 这类缩写也不再断句。每个库的伪查询都变了一些，全部重新拟合一遍
MODEL_REVISION = 12

# 至少要这么多个可检索分块才拟合。以前是 30，后来 5（向量与混合 3），再后来向量与混合 1、全文 5；现在三种方式都从
# 1 块起：分块更少的库（一个新用户的前几份文档、一个 Agent 的小笔记库）用全局校准时，向量方式一条都到不了 0.5，
# 全文方式问的正是它的问题也只有 0.01~0.16。cmrc2018 里抽出的 40 个 1~6 块的小库（docs/EVALUATION.md“三块的库”
# “一两个分块的库”“小库的全文方式”）：
# - 向量与混合靠外来问题出反例（:func:`foreign_questions`、``search.relevance.foreign_share``）：1~2 块的库 0.5 处
#   精确率 / 召回率 向量 0 / 0 → 1.00 / 0.94~0.97，混合 → 1.00 / 0.89~0.90（每句出 5 条伪查询，
#   ``search.relevance.FOREIGN_VARIANTS``），别的话题的问题第一名均值 ≤ 0.166；没有外来问题时 1 块的库造不出反例，
#   2 块的库学成“别的话题也有答案”（那个均值 0.26~0.29）；
# - 全文方式在小库里只做单调的重新校准（:data:`SMALL_MODE_FEATURES`、:data:`MONOTONE_CHUNKS`）：四个特征的模型
#   3 块时别的话题的问题第一名均值 0.38、4 块 0.19，加外来问题的 1~2 块的库召回率也只有 0.03~0.24
MIN_CHUNKS = 1
# 分块不到这么多个的库是小库：拟合时另拿外来问题出反例（``search.relevance.foreign_share``）。5 块起的库有拿掉答案
# 的变体出反例，不用外来问题
SMALL_CHUNKS = 5
# 写入越过这些分块数时立即拟合（:func:`fit_on_write`）
FIT_POINTS = (MIN_CHUNKS, SMALL_CHUNKS)


# 拟合时不到这么多个分块的模型算临时的（``search.relevance.profiles_due``）：库又变了两成就在下一次检查时重新拟合，
# 不等“离上次拟合至少十分钟”——1 块时拟合过的库到 5 块就不再是小库，模型的做法要换。写入也只替这么小的库立即拟合
# （:func:`fit_on_write`）：小库句子少、伪查询少，拟合几秒钟；批量导入的库第一篇长文档就有几十块，要是那时就拟合，
# 接下来十分钟都用一篇文档学出的模型打分（伪查询的候选全在同一篇里，往往一种方式也学不出），不如照旧交给定时任务
PROVISIONAL_CHUNKS = 30
# 分块不到这么多个的库，:data:`SMALL_MODE_FEATURES` 里的方式（全文）只做单调的重新校准。cmrc2018 抽出的库上
# 0.5 处召回率：6~26 块四个特征的模型 0.48~0.64、单调校准 0.82~0.88，45~97 块 0.64~0.82 → 0.80~0.86，116~198 块
# 0.70 → 0.74（六个库里五个更好），精确率不变、名次逐条相同、别的话题的问题第一名更低；234~240 块起四个特征的模型
# 更好（0.81 对 0.69~0.80，开发集 0.81~0.82 对 0.65~0.77），见 docs/EVALUATION.md“100 块以下的汉字库的全文方式”
# “界线挪到 200 块”。库越过界线后照常在分块数变了两成时重新拟合，
# 换成四个特征的模型。只用于汉字库（``raglib.analysis.text_script`` 非空）：英文的库正相反——squad 两篇文档的库
# （32、62 块）召回率 0.41 / 0.85 → 0.38 / 0.54，一篇一库（13~54 块）按分块判精确率 0.76 → 0.64——别的文字仍是
# 不到 SMALL_CHUNKS 块才单调
MONOTONE_CHUNKS = 200


def fit_on_write(before: int, after: int) -> bool:
    """写入让知识库的分块从 ``before`` 个变成 ``after`` 个，是否该立即拟合（``documents.ingestion`` 按它入队）：
    刚够拟合（:data:`MIN_CHUNKS`）或刚不算小库（:data:`SMALL_CHUNKS`：不再用外来问题），
    而库还不到 :data:`PROVISIONAL_CHUNKS` 块。一个库一生只有一两次。"""
    return after < PROVISIONAL_CHUNKS and any(before < least <= after for least in FIT_POINTS)

# 每个特征权重允许的符号（+1：越大越相关；-1：越小越相关，名次）。见 fit_model
FEATURE_SIGNS: dict[str, int] = {
    "similarity": 1, "similarity_gap": 1, "similarity_lift": 1, "vector_rank": -1,
    "match": 1, "match_share": 1, "fulltext_rank": -1, "coverage": 1, "calibrated": 1, "fulltext_calibrated": 1,
}
# 只能单调使用的特征组（全局校准之上的重新校准）：唯一的特征拟合不出正的权重时不用这个模型（回到全局校准），
# 截断也不做（截断会造成并列）
MONOTONE_FEATURES = frozenset({("calibrated",), ("fulltext_calibrated",)})


def fit_logistic(features: np.ndarray, labels: np.ndarray, *, l2: float = 1e-3, iterations: int = 50,
                 weights: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """返回 (权重, 截距)，使 sigmoid(features @ 权重 + 截距) 逼近 labels（``weights`` 是每个样本算几个，默认都是 1）。
    牛顿法（IRLS），截距不加正则。"""
    x = np.hstack([features, np.ones((len(features), 1))])
    sample = np.ones(len(x)) if weights is None else weights
    w = np.zeros(x.shape[1])
    penalty = np.full(len(w), l2)
    penalty[-1] = 0.0
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-np.clip(x @ w, -30, 30)))
        gradient = x.T @ (sample * (p - labels)) + penalty * w
        hessian = (x * (sample * p * (1 - p))[:, None]).T @ x + np.diag(penalty) + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w[:-1], float(w[-1])


@dataclass(frozen=True)
class Evidence:
    """一个候选在一次检索里的证据；某一路没有参与（单路检索）时对应的值为 None。"""

    similarity: float | None
    match: float | None
    vector_rank: int | None
    fulltext_rank: int | None
    # 在融合（RRF）顺序里的名次：让模型至少学得出 RRF 的排序，拟合出来的排序不会比它差太多
    fused_rank: int | None = None
    # 查询词的邻近程度（raglib.proximity.sentence_share）：只有混合方式排在前面的候选有，其余为 None（按 0 计）
    proximity: float | None = None


def _log_rank(rank: int | None, depth: int) -> float:
    # 没进名单的候选按“名单之后一名”计：它的真实名次不会更靠前
    return math.log1p(rank if rank is not None else depth + 1)


def candidate_features(candidates: Sequence[Evidence], *, coverage: float, depth: int, gate: float = 1.0,
                       calibration: Calibration | None = None,
                       path_similarities: Sequence[float] = ()) -> list[dict[str, float]]:
    """一次检索的全部候选 → 每个候选的特征（:data:`MODE_FEATURES` 里的名字）。差值特征相对本次检索最好的那条。

    ``gate`` 是全文一路的可信程度（覆盖率闸门，见 :func:`raglib.fusion.lexical_gate`）：两个匹配特征都乘上它。
    伪查询的覆盖率都很高（闸门为 1），模型没见过“查询的词在库里大多没有”的情形；另一种语言的问题只匹配上零星的
    数字、人名时，乘上闸门才不会把这种匹配当成证据。``calibration`` 给出时另算 ``calibrated``（混合方式的全局校准
    对数几率，用的是乘过闸门的匹配程度与邻近程度；邻近程度也是字面的证据）。

    ``path_similarities`` 是向量一路取回的全部相似度（不只是进了候选的）：第 :data:`LIFT_RANK` 名的参照从它们里取。
    只看候选时，top_k=1 的检索只有 3 个候选，参照成了第 3 名，同一条结果的分数随 top_k 变（英文问题问中文库，
    第一名的均值 top_k=10 时 0.33、top_k=1 时 0.13）。"""
    own = [c.similarity for c in candidates if c.similarity is not None]
    similarities = sorted(path_similarities or own, reverse=True)
    best_similarity = max([*similarities[:1], *own], default=0.0)
    best_match = max((c.match for c in candidates if c.match is not None), default=0.0)
    reference = similarities[min(LIFT_RANK, len(similarities)) - 1] if similarities else 0.0
    rows = []
    for c in candidates:
        similarity = c.similarity if c.similarity is not None else 0.0
        match = c.match if c.match is not None else 0.0
        proximity = c.proximity if c.proximity is not None else 0.0
        rows.append({
            "similarity": similarity,
            "similarity_gap": similarity - best_similarity,
            "similarity_lift": similarity - reference,
            "vector_rank": _log_rank(c.vector_rank, depth),
            "match": match * gate,
            # 相对本次最好的那条：用比例而不是差——一个词都没匹配上的查询，最好的那条也是 0，
            # 差为 0 会被当成“和最好的一样好”
            "match_share": gate * match / best_match if best_match > 0 else 0.0,
            "fulltext_rank": _log_rank(c.fulltext_rank, depth),
            "coverage": coverage,
            "both": 1.0 if c.vector_rank is not None and c.fulltext_rank is not None else 0.0,
            "fused_rank": _log_rank(c.fused_rank, 2 * depth),
            "proximity": proximity * gate,
        })
        if calibration is not None:
            rows[-1]["calibrated"] = hybrid_logit(similarity, match * gate, calibration, proximity * gate)
            rows[-1]["fulltext_calibrated"] = fulltext_logit(match, calibration)
    return rows


@dataclass(frozen=True)
class RelevanceModel:
    """一种检索方式的 P(相关) 模型：标准化参数与逻辑回归的权重。可以存成 JSON（:meth:`as_dict`）。"""

    mode: str
    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float
    # 训练时各特征的取值范围：预测时先截到这个范围里。线性模型在没见过的取值上外推会给出离谱的概率——
    # 伪查询的覆盖率都在 0.6 以上，英文问题问中文库时覆盖率接近 0，不截断时它能把概率推到 0.9
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()
    # 拟合做法的版本（:data:`MODEL_REVISION`）：做法变了，旧模型算过时，定时任务会重新拟合
    revision: int = 0

    def probability(self, row: Mapping[str, float]) -> float:
        values = [row[name] for name in self.features]
        if self.low and self.high:
            values = [min(max(v, lo), hi) for v, lo, hi in zip(values, self.low, self.high, strict=True)]
        z = self.bias + sum(w * (v - m) / s for v, m, s, w in zip(values, self.mean, self.scale, self.weights,
                                                                  strict=True))
        return 1 / (1 + math.exp(-min(max(z, -30.0), 30.0)))

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "features": list(self.features), "mean": list(self.mean),
                "scale": list(self.scale), "weights": list(self.weights), "bias": self.bias,
                "low": list(self.low), "high": list(self.high), "revision": self.revision}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RelevanceModel:
        return cls(str(data["mode"]), tuple(data["features"]), tuple(float(v) for v in data["mean"]),
                   tuple(float(v) for v in data["scale"]), tuple(float(v) for v in data["weights"]),
                   float(data["bias"]), tuple(float(v) for v in data.get("low", ())),
                   tuple(float(v) for v in data.get("high", ())), int(data.get("revision", 0)))


def mode_features(mode: str, chunks: int | None = None, script: str = "") -> tuple[str, ...]:
    """一种方式的模型用的特征：``chunks`` 是库的可检索分块数，``script`` 是库的汉字写法
    （``raglib.analysis.text_script``，汉字太少的库为空）。汉字库不到 :data:`MONOTONE_CHUNKS` 个、别的库不到
    :data:`SMALL_CHUNKS` 个时用 :data:`SMALL_MODE_FEATURES` 里的（没给分块数时按大库）。"""
    if chunks is not None and chunks < (MONOTONE_CHUNKS if script else SMALL_CHUNKS):
        return SMALL_MODE_FEATURES.get(mode, MODE_FEATURES[mode])
    return MODE_FEATURES[mode]


def fit_model(mode: str, rows: Sequence[Mapping[str, float]], labels: Sequence[float],
              sample_weights: Sequence[float] | None = None, *, chunks: int | None = None,
              script: str = "") -> RelevanceModel | None:
    """在 (特征, 相关程度 0~1) 上拟合一种方式的模型（``sample_weights``：每个样本算几个；``chunks``、``script``：
    库的可检索分块数与汉字写法，决定特征，见 :func:`mode_features`）；特征先按训练集标准化（常数特征的尺度记为 1）。

    权重的符号受约束（:data:`FEATURE_SIGNS`）：证据变强时概率不降。拟合出反向权重的特征去掉后重拟合，
    直到全部同向——反向的权重是模型借别的特征的组合去猜标签里特征之外的东西（例如“与出处同一篇文档”），
    在真实问题上会把证据更弱的结果排到前面。单调的特征组（:data:`MONOTONE_FEATURES`）一个特征都不剩时返回 None，
    且不记取值范围（不截断）。"""
    names = mode_features(mode, chunks, script)
    x = np.array([[row[name] for name in names] for row in rows], dtype=float)
    y = np.array(labels, dtype=float)
    sample = None if sample_weights is None else np.array(sample_weights, dtype=float)
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    used = [i for i in range(len(names)) if x[:, i].std() > 1e-9]
    weights = np.zeros(len(names))
    # 一个特征都不剩时只有截距：训练集平均相关程度的对数几率
    share = float(np.clip(np.average(y, weights=sample), 1e-6, 1 - 1e-6))
    bias = math.log(share / (1 - share))
    while used:
        fitted, fitted_bias = fit_logistic((x[:, used] - mean[used]) / scale[used], y, l2=L2, weights=sample)
        signed = fitted * np.array([FEATURE_SIGNS[names[i]] for i in used])
        if signed.min() >= 0:
            weights[used] = fitted
            bias = fitted_bias
            break
        del used[int(np.argmin(signed))]
    monotone = names in MONOTONE_FEATURES
    if monotone and not used:
        return None
    low, high = ((), ()) if monotone else (tuple(float(v) for v in x.min(axis=0)),
                                           tuple(float(v) for v in x.max(axis=0)))
    return RelevanceModel(mode, names, tuple(float(v) for v in mean), tuple(float(v) for v in scale),
                          tuple(float(v) for v in weights), bias, low, high, MODEL_REVISION)


# ---------------------------------------------------------------- 外来问题

_FOREIGN_FILE = Path(__file__).with_name("foreign_questions.txt")


@functools.cache
def foreign_questions() -> tuple[str, ...]:
    """随包的外来问题（``raglib/foreign_questions.txt``）：各种话题、简繁英三种写法的提问，不属于任何知识库。

    伪查询全出自库里的句子，总有答案；拿掉答案的变体（:func:`without`）又要库里还剩别的分块。一两个分块的库两样都
    造不出“库里没有答案”的提问，模型不知道别的话题的问题会落在哪里。拿这些问题去检索这个库，返回的全是反例。"""
    lines = _FOREIGN_FILE.read_text(encoding="utf-8").splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


# ---------------------------------------------------------------- 伪查询

_HAN = re.compile(r"[\u3400-\u9fff]")
_MARKUP = re.compile(r"^[#>*\-\s|]+")
_LETTER = re.compile(r"[^\W\d_]")
# 去字（词）之后至少还要剩这么多汉字（汉字句）或含字母的词（其他文字），否则这句不出题。“臀鳍鳍条119至156枚；”
# 去掉一半的字剩下“1枚；”，库里几十条鱼的分块都同样匹配它，标签却只认出题的那一块：一个种子抽到几条这样的题，
# 混合方式的校准斜率就从 1.5 掉到 0.6，cmrc2018 上 0.5 处的召回率从 0.85 掉到 0.15（docs/EVALUATION.md）
MIN_KEPT_HAN = 6
MIN_KEPT_WORDS = 3


@dataclass(frozen=True)
class PseudoQuery:
    """一条伪查询：文本、出处分块，以及判相关用的原句（含它的分块都算相关）。"""

    text: str
    source: int
    sentence: str


def _sentences(text: str) -> list[str]:
    # 与分块器同一个句子定义：PDF 的硬换行不断句，否则伪查询只是一行的片段
    return [sentence for part in split_sentences(text) if (sentence := _MARKUP.sub("", part).strip())]


def _is_han(sentence: str) -> bool:
    return len(_HAN.findall(sentence)) >= len(sentence) / 3


def _usable(sentence: str) -> bool:
    if _is_han(sentence):
        return 12 <= len(sentence) <= 120
    return 6 <= len(sentence.split()) <= 40


# 别的文章里有一句与出题的原句足够像（汉字句比字二元组、其他文字比词，Jaccard）而又不是原样时，这条伪查询没有
# 确定的答案，不用它（:func:`ambiguous`）：鱼类条目里“背鳍硬棘9枚、背鳍软条12枚、臀鳍硬棘3枚……”这样的句子几十篇
# 文章各有一句，只差数字（字二元组 0.57，不相干的两句中文约 0）；问诊对话里“建议去医院检查一下”人人都说。只认出题的
# 那一块时几十个同样好的结果都成了反例，一个种子抽到几条这样的题，混合方式的校准斜率就从 1.5 掉到 0.6。把它们都记
# 成相关也不对：toyhom 上模型因此把字面重合当成相关，0.5 处的精确率掉到 0.14（docs/EVALUATION.md）。英文比词而不比
# 字二元组：字二元组在不相干的英文句之间就有 0.2~0.4（squad 的 1,608 句里 0.5 以上 22 对，多是同话题的不同句子），
# 比词时 0.5 以上 10 对，都是改了几个词的同一句话
NEAR_COPY = 0.5
_NOT_WORD = re.compile(r"[\W_]+")
_WORD = re.compile(r"[^\W_]+")


@functools.lru_cache(maxsize=8192)
def _shingles(sentence: str) -> frozenset[str]:
    if _is_han(sentence):
        text = _NOT_WORD.sub("", sentence.lower())
        return frozenset(text[i:i + 2] for i in range(len(text) - 1))
    return frozenset(_WORD.findall(sentence.lower()))


@functools.lru_cache(maxsize=4096)
def _sentence_shingles(text: str) -> tuple[frozenset[str], ...]:
    # 拟合时同一个分块会作为上百个伪查询的候选出现：切句与分词各算一次
    return tuple(_shingles(sentence) for sentence in _sentences(text))


def ambiguous(sentence: str, others: Iterable[str]) -> bool:
    """别的文章的分块（``others``）里有一句与 ``sentence`` 几乎相同（:data:`NEAR_COPY`）又不是原样：用它出的伪查询
    没有确定的答案。原样出现的（转载的同一篇文章）不算，含原句的分块本来就记为相关。"""
    target = _shingles(sentence)
    return any(sentence not in text and any(len(target & other) >= NEAR_COPY * len(target | other)
                                            for other in _sentence_shingles(text)) for text in others)


def _informative(text: str, sentence: str) -> bool:
    """去字（词）后的伪查询还认得出是在问什么：见 :data:`MIN_KEPT_HAN`。"""
    if _is_han(sentence):
        return len(_HAN.findall(text)) >= MIN_KEPT_HAN
    return sum(bool(_LETTER.search(word)) for word in text.split()) >= MIN_KEPT_WORDS


@dataclass(frozen=True)
class DropShare:
    """伪查询从原句里去掉的比例，按句子的文字分：汉字句去字（``han``），其他文字的句子去词（``other``）。
    两种文字分开定，是因为同样的比例对它们的意思不同：汉字一小段一小段地去，剩下的字仍连成不少原文的二元组；
    英文去掉一半的词，剩下的几个词与原文的字面重合就很少了（见 ``search.relevance.DROP_SHARES``）。"""

    han: float
    other: float

    @classmethod
    def both(cls, share: float) -> DropShare:
        return cls(share, share)


# 两种文字都去掉约三分之一：向量与全文方式的做法（search.relevance.DROP_SHARES）
DEFAULT_DROP_SHARE = DropShare.both(0.35)


def _drop(sentence: str, rng: random.Random, share: DropShare) -> str:
    """去掉约 ``share`` 的字（汉字句，连续的一小段一小段地去）或词（其他文字），保持原来的先后次序。"""
    if _is_han(sentence):
        chars = list(sentence)
        keep = [True] * len(chars)
        while keep.count(False) < share.han * len(chars):
            start = rng.randrange(len(chars))
            for i in range(start, min(start + rng.randint(1, 3), len(chars))):
                keep[i] = False
        return "".join(char for char, kept in zip(chars, keep, strict=True) if kept)
    words = sentence.split()
    kept_words = [word for word in words if rng.random() >= share.other]
    return " ".join(kept_words or words[:1])


def pseudo_queries(chunks: Sequence[tuple[int, str]], count: int, *, seed: int,
                   share: DropShare = DEFAULT_DROP_SHARE, variants: int = 1) -> list[PseudoQuery]:
    """从分块里造 ``count`` 条伪查询（固定 ``seed`` 时结果确定）：每个被抽中的分块出一句话，按 ``share`` 去掉一部分
    字或词；去完剩下的太少（:data:`MIN_KEPT_HAN`）的那句不出题。分块不到 ``count`` 个时（小知识库）再按同样的顺序
    一轮轮地从各分块里取还没出过题的句子，直到够数或句子用完——只出一轮时 20 个分块的库只有 20 条伪查询，留出两成后
    十几条，模型学不稳。可用的句子太少（分块都很短）时条数会少于 ``count``。``variants`` 大于 1 时每句最多出这么多条
    （每条随机去掉不同的字；一两块的库只有几句话）。"""
    rng = random.Random(seed)  # noqa: S311 - 造题要可复现，不涉及安全
    order = list(range(len(chunks)))
    rng.shuffle(order)
    queries: list[PseudoQuery] = []
    # 每个分块还没出过题的句子（第一次轮到它时才切句）
    unused: dict[int, list[str]] = {}
    drawn = True
    while len(queries) < count and drawn:
        drawn = False
        for index in order:
            if len(queries) >= count:
                break
            chunk_id, text = chunks[index]
            if index not in unused:
                unused[index] = [s for s in _sentences(text) if _usable(s)] * variants
            sentences = unused[index]
            if not sentences:
                continue
            drawn = True
            sentence = sentences.pop(rng.randrange(len(sentences)))
            dropped = _drop(sentence, rng, share)
            if _informative(dropped, sentence):
                queries.append(PseudoQuery(dropped, chunk_id, sentence))
    return queries


def without(evidence: Sequence[Evidence], drop: Sequence[bool]) -> list[Evidence]:
    """去掉一部分候选（伪查询的相关结果）后剩下的证据，各路名次按剩下的重新排：模拟“库里没有答案”的查询。

    伪查询总有一个相关结果在库里，只用它们学，模型会以为“本次最好的那条”多半相关；无关的问题（另一个话题、
    另一种语言）来了也给第一名高分。把答案拿掉再看一遍，模型才学得到：最好的那条本身够不够好。
    """
    kept = [item for item, dropped in zip(evidence, drop, strict=True) if not dropped]

    def reranked(ranks: list[int | None]) -> list[int | None]:
        order = sorted((rank, i) for i, rank in enumerate(ranks) if rank is not None)
        new: dict[int, int] = {i: position for position, (_, i) in enumerate(order, start=1)}
        return [new.get(i) for i in range(len(ranks))]

    vector = reranked([e.vector_rank for e in kept])
    text = reranked([e.fulltext_rank for e in kept])
    fused = reranked([e.fused_rank for e in kept])
    return [Evidence(e.similarity, e.match, v, t, f) for e, v, t, f in zip(kept, vector, text, fused, strict=True)]


def reciprocal_rank(labels: Sequence[bool]) -> float:
    """按给定顺序第一个相关结果的倒数名次（没有相关结果为 0）。"""
    return next((1.0 / rank for rank, label in enumerate(labels, start=1) if label), 0.0)
