"""评测指标（与 BEIR / pytrec_eval 的定义一致），全部是纯函数。

- ``ranked``：检索结果按名次排列的 id（已去重：同一文档的多个分块只算第一次出现）；
- ``qrels``：该查询的相关性标注 ``{id: 相关度}``，相关度 > 0 才算相关。
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence


def dedupe(ids: Iterable[str]) -> list[str]:
    """保序去重：分块映射回文档后，同一文档只保留最好的名次。"""
    return list(dict.fromkeys(ids))


def _relevant(qrels: Mapping[str, int]) -> set[str]:
    return {doc for doc, grade in qrels.items() if grade > 0}


def ndcg_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    """nDCG@k：增益为相关度本身（pytrec_eval 的 ndcg_cut），折损 1/log2(名次+1)。"""
    dcg = sum(qrels.get(doc, 0) / math.log2(rank + 1) for rank, doc in enumerate(ranked[:k], start=1)
              if qrels.get(doc, 0) > 0)
    ideal = sorted((grade for grade in qrels.values() if grade > 0), reverse=True)[:k]
    idcg = sum(grade / math.log2(rank + 1) for rank, grade in enumerate(ideal, start=1))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    """Recall@k：前 k 个里找到的相关 id 占全部相关 id 的比例。"""
    relevant = _relevant(qrels)
    if not relevant:
        return 0.0
    return len(relevant & set(ranked[:k])) / len(relevant)


def mrr_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    """MRR@k：前 k 个里第一个相关 id 的名次倒数，没有则为 0。"""
    relevant = _relevant(qrels)
    for rank, doc in enumerate(ranked[:k], start=1):
        if doc in relevant:
            return 1.0 / rank
    return 0.0


def answer_hit_at_k(texts: Sequence[str], answers: Sequence[str], k: int) -> float:
    """answer-hit@k：前 k 个分块里有一个逐字包含任一标准答案即为 1。与分块方式无关，
    所以能在段落级与文档级、不同分块器之间直接比较。"""
    wanted = [answer for answer in answers if answer]
    return float(any(answer in text for text in texts[:k] for answer in wanted))


def percentile(values: Sequence[float], q: float) -> float:
    """线性插值的百分位（与 numpy 默认一致）；空序列为 0。"""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
