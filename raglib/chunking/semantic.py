"""语义断崖分块（见 docs/INVARIANTS.md 的 QUOTE-INTACT、ADJACENT-SIM-COUNT、CLIFF-THRESHOLD、CHUNK-SIZE-LIMIT）。

流程：句子切分（引号内不切）→ 一次批量 embedding → 相邻句余弦相似度（n 句得 n-1 个）
→ 断崖 = 相似度 ≤ 第 p 百分位阈值的位置 → 在断崖处切开、超过 token 上限时强制切开。

断崖的精确定义：``sims[i]`` 是第 i 句与第 i+1 句的余弦相似度；
``threshold = numpy.percentile(sims, p)``（默认 ``method="linear"``：把 sims 升序排成 x₀…x_{m-1}，
取秩 r = p/100·(m-1)，阈值 = x_⌊r⌋ + (r-⌊r⌋)·(x_⌊r⌋+1 - x_⌊r⌋)）；
位置 i 是断崖 ⇔ ``sims[i] <= threshold``，表示在第 i 句之后切开。
因为阈值不小于最小值，只要有 ≥2 句就至少有一个断崖；所有相似度相等时每个位置都是断崖。

这里的几个函数都是纯函数（不做 I/O），便于属性测试。
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["adjacent_similarities", "cliff_threshold", "find_cliffs", "merge_into_chunks"]


def adjacent_similarities(vectors: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """n 个向量 → n-1 个相邻余弦相似度（n < 2 时为空数组）。

    输入按约定已 L2 归一化；这里仍按范数再归一一次（零向量的相似度记为 0），
    这样调用方传入未归一化的向量也不会得到越界的值。结果裁剪到 [-1, 1]。
    """
    matrix = np.asarray(vectors, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"expected a 2-D array of vectors, got shape {matrix.shape}")
    if matrix.shape[0] < 2:
        return np.zeros(0, dtype=np.float64)
    # 先按每行最大绝对值缩放再求范数，避免极小/极大分量平方时下溢或上溢
    scale = np.max(np.abs(matrix), axis=1)
    zero = ~(scale > 0)
    scaled = matrix / np.where(zero, 1.0, scale)[:, None]
    norms = np.linalg.norm(scaled, axis=1)
    unit = scaled / np.where(zero, 1.0, norms)[:, None]
    sims = np.einsum("ij,ij->i", unit[:-1], unit[1:])
    sims[zero[:-1] | zero[1:]] = 0.0
    return np.clip(sims, -1.0, 1.0)


def cliff_threshold(similarities: Sequence[float] | np.ndarray, percentile: float = 20.0) -> float:
    """断崖阈值：相似度的第 ``percentile`` 百分位（numpy 线性插值）。空输入返回 ``nan``。"""
    values = np.asarray(similarities, dtype=np.float64)
    if values.size == 0:
        return float("nan")
    return float(np.percentile(values, percentile, method="linear"))


def find_cliffs(similarities: Sequence[float] | np.ndarray, percentile: float = 20.0) -> list[int]:
    """断崖位置（升序）：``sims[i] <= cliff_threshold(sims, percentile)`` 的全部 i。"""
    values = np.asarray(similarities, dtype=np.float64)
    if values.size == 0:
        return []
    threshold = cliff_threshold(values, percentile)
    return [int(i) for i in np.flatnonzero(values <= threshold)]


def merge_into_chunks(
    token_counts: Sequence[int],
    cliffs: Iterable[int],
    max_tokens: int,
    min_tokens: int = 0,
) -> list[tuple[int, int]]:
    """把句子按顺序合并成块，返回句子下标的半开区间 ``[(i, j), ...]``，覆盖 0..n 且不重叠。

    规则：
    1. 每个断崖 i 都在第 i 句之后切开（断崖是首选切分点）；
    2. 块内句子 token 数之和不超过 ``max_tokens``：下一句放不下时强制切开（与语义无关）；
       单句本身超过上限时独占一块（调用方应事先把这种句子再切小）；
    3. ``min_tokens`` > 0 时，和小于它的块与相邻块合并（优先并入后一块，否则并入前一块），
       前提是合并后仍不超过 ``max_tokens``——这一步可能撤销个别断崖切分。
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    count = len(token_counts)
    cliff_set = set(cliffs)
    groups: list[tuple[int, int]] = []
    sums: list[int] = []
    begin = 0
    total = 0
    for index, tokens in enumerate(token_counts):
        if index > begin and total + tokens > max_tokens:
            groups.append((begin, index))
            sums.append(total)
            begin, total = index, 0
        total += tokens
        if index in cliff_set and index + 1 < count:
            groups.append((begin, index + 1))
            sums.append(total)
            begin, total = index + 1, 0
    if begin < count:
        groups.append((begin, count))
        sums.append(total)
    if min_tokens > 0:
        groups = _merge_small(groups, sums, max_tokens, min_tokens)
    return groups


def _merge_small(
    groups: list[tuple[int, int]], sums: list[int], max_tokens: int, min_tokens: int
) -> list[tuple[int, int]]:
    merged = list(groups)
    totals = list(sums)
    index = 0
    while index < len(merged):
        if totals[index] >= min_tokens or len(merged) == 1:
            index += 1
            continue
        if index + 1 < len(merged) and totals[index] + totals[index + 1] <= max_tokens:
            merged[index] = (merged[index][0], merged[index + 1][1])
            totals[index] += totals.pop(index + 1)
            merged.pop(index + 1)
            continue  # 合并后可能仍然偏小，再检查一次
        if index > 0 and totals[index - 1] + totals[index] <= max_tokens:
            merged[index - 1] = (merged[index - 1][0], merged[index][1])
            totals[index - 1] += totals.pop(index)
            merged.pop(index)
            continue
        index += 1
    return merged
