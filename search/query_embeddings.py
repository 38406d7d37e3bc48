"""查询向量的进程内 LRU 缓存。

同一个问题常被反复提交（Agent 重试、多轮对话里的同一子问题），而查询向量化是检索里最贵的一步之一。
键是（提供方, 模型, 查询原文），不同知识库只要模型相同就共享。失败不缓存：熔断打开期间每次都会
重新询问提供方（被断路器立即拒绝，几乎无开销），恢复后马上生效。
"""

from __future__ import annotations

import threading

import numpy as np
from cachetools import LRUCache
from django.conf import settings

from infra.embedders import embedder
from infra.metrics import QUERY_EMBEDDING_CACHE

_lock = threading.Lock()
_cache: LRUCache[tuple[str, str, str], np.ndarray] | None = None


def _the_cache() -> LRUCache[tuple[str, str, str], np.ndarray] | None:
    global _cache
    size = settings.QUERY_EMBEDDING_CACHE_SIZE
    if size <= 0:
        return None
    if _cache is None or _cache.maxsize != size:
        _cache = LRUCache(maxsize=size)
    return _cache


def embed_query(provider: str, model: str, query: str) -> tuple[np.ndarray, bool]:
    """返回 (L2 归一化的查询向量, 是否命中缓存)。提供方的异常（含熔断）原样抛出。"""
    key = (provider, model, query)
    with _lock:
        cache = _the_cache()
        cached = cache.get(key) if cache is not None else None
    if cached is not None:
        QUERY_EMBEDDING_CACHE.labels(result="hit").inc()
        return cached, True
    QUERY_EMBEDDING_CACHE.labels(result="miss").inc()
    vector = np.asarray(embedder(provider, model).embed_query(query), dtype=np.float32)
    # 缓存里的数组被多个请求共享，设为只读防止被意外修改
    vector.setflags(write=False)
    with _lock:
        cache = _the_cache()
        if cache is not None:
            cache[key] = vector
    return vector, False


def clear_query_embeddings() -> None:
    """清空缓存（测试、切换模型后）。"""
    global _cache
    with _lock:
        _cache = None
