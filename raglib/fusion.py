"""检索结果的融合与整理：RRF、无重排时的 0~1 分数、父子块去重、按文档位置排序、父块窗口。

全是纯函数，不碰数据库与模型，便于用 hypothesis 验证（见 docs/INVARIANTS.md 的 RRF-SCORE、RRF-ORDER、
PARENT-DEDUP、CONTEXT-ORDER、RERANK-FALLBACK）。
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclass(frozen=True)
class Fused:
    """一个候选在融合后的位置：RRF 分数，以及它在各路中的名次（从 1 起，未命中为 None）。"""

    key: int
    score: float
    ranks: Mapping[str, int]

    @property
    def best_rank(self) -> int:
        return min(self.ranks.values())


def rrf_fuse(rankings: Mapping[str, Sequence[int]], k: int = 60,
             weights: Mapping[str, float] | None = None) -> list[Fused]:
    """（加权）Reciprocal Rank Fusion：路 p 的第 r 名（r 从 1 起）贡献 ``w_p/(k+r)``，各路命中的分数相加。

    ``weights`` 缺省时每路权重 1（经典 RRF）；权重为 0 的路仍记录名次（调试页展示），但不影响分数。
    按分数降序；同分时依次比较最好名次、命中路数（多者优先）、key，结果完全确定。
    同一路里重复出现的 key 只按第一次（最好）的名次计。
    """
    scores: dict[int, float] = {}
    ranks: dict[int, dict[str, int]] = {}
    for path, keys in rankings.items():
        weight = 1.0 if weights is None else weights.get(path, 1.0)
        for rank, key in enumerate(keys, start=1):
            seen = ranks.setdefault(key, {})
            if path in seen:
                continue
            seen[path] = rank
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
    fused = [Fused(key, scores[key], ranks[key]) for key in scores]
    fused.sort(key=lambda f: (-f.score, f.best_rank, -len(f.ranks), f.key))
    return fused


def lexical_gate(coverage: float, floor: float, full: float) -> float:
    """全文一路的权重闸门：覆盖率 ≤ ``floor`` 时为 0（这一路只认出了人名、数字这类零星的词，排名不可信），
    ≥ ``full`` 时为 1，中间线性过渡。``floor`` ≥ ``full`` 时退化成在 ``full`` 处的阶跃。"""
    if coverage >= full:
        return 1.0
    if coverage <= floor:
        return 0.0
    return (coverage - floor) / (full - floor)


def similarity_from_distance(distance: float) -> float:
    """余弦距离（0~2）→ 0~1 的相似度：``1 - distance`` 截断到 [0, 1]（负相关视为 0）。"""
    return min(1.0, max(0.0, 1.0 - distance))


def order_by_scores(items: Sequence[T], scores: Sequence[float]) -> list[tuple[T, float]]:
    """按分数降序稳定排序：同分保持原顺序（即融合顺序），所以重排结果也是确定的。"""
    if len(items) != len(scores):
        raise ValueError(f"got {len(scores)} scores for {len(items)} items")
    order = sorted(range(len(items)), key=lambda i: -scores[i])
    return [(items[i], scores[i]) for i in order]


def collapse_by(items: Iterable[T], group: Callable[[T], K | None]) -> list[T]:
    """按组去重，保留每组第一次出现的项（输入已按分数降序，所以留下的是组内得分最高的子块）。

    ``group`` 返回 None 的项（普通分块）各自成组。
    """
    seen: set[K] = set()
    kept: list[T] = []
    for item in items:
        key = group(item)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        kept.append(item)
    return kept


def context_window(text: str, start: int, end: int, size: int) -> tuple[str, int]:
    """从长父块里截出约 ``size`` 个字符、以命中子块 ``[start, end)`` 为中心的窗口。

    返回 (窗口文本, 窗口在父块中的起点)。子块本身比窗口还长时从子块起点截取。
    """
    if len(text) <= size:
        return text, 0
    start = min(max(start, 0), len(text))
    end = min(max(end, start), len(text))
    slack = max(size - (end - start), 0)
    begin = max(0, start - slack // 2)
    begin = min(begin, len(text) - size)
    return text[begin:begin + size], begin
