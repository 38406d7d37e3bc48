"""评测用的文档向量缓存：同一份数据集反复评测（换切词、换排序、换融合）时不必每次重新向量化。

摄取流水线按文档逐个调用 embedding（评测里一个段落一份文档，批大小常常是 1），在 2 核 CPU 上 7k 个段落要一个多小时。
这里先把全部单元的文本按大批次算好（与流水线切出的分块文本相同的那些会直接命中），存到
``RAG_DATA_DIR/eval-cache/<提供方>-<模型>.npz``；摄取期间临时把提供方的内层模型换成“先查缓存”的包装，
没命中的文本照常由模型计算。缓存只在评测命令里生效，服务本身的摄取不受影响。
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings

from infra.embedders import embedder
from raglib.providers.embedding import EmbeddingProvider
from raglib.providers.vectors import Vectors

BATCH = 64


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _CachedEmbeddings:
    """包住提供方的内层模型：``embed_documents`` 先查缓存，只把没见过的文本交给模型；
    ``queries`` 为真时查询向量也缓存（键加前缀，与文档向量分开：e5 之类的模型对两者加不同的前缀）。"""

    def __init__(self, inner: EmbeddingProvider, cache: dict[str, np.ndarray], *, queries: bool) -> None:
        self.inner = inner
        self.cache = cache
        self.queries = queries
        self.provider = inner.provider
        self.model = inner.model
        self.dimension = inner.dimension

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        keys = [_key(text) for text in texts]
        # 每个没见过的文本只算一次（同一批里重复的文本取第一次出现的位置）
        first = {key: i for i, key in reversed(list(enumerate(keys)))}
        missing = [i for key, i in first.items() if key not in self.cache]
        if missing:
            computed = self.inner.embed_documents([texts[i] for i in missing])
            self.cache.update((keys[i], vector) for i, vector in zip(missing, computed, strict=True))
        return np.stack([self.cache[key] for key in keys]).astype(np.float32, copy=False)

    def embed_query(self, text: str) -> Vectors:
        if not self.queries:
            return self.inner.embed_query(text)
        key = "query:" + _key(text)
        if key not in self.cache:
            self.cache[key] = self.inner.embed_query(text)
        return self.cache[key]


def cache_path(provider: str, model: str) -> Path:
    return Path(settings.DATA_DIR) / "eval-cache" / (re.sub(r"[^\w.-]", "_", f"{provider}-{model}") + ".npz")


def _load(path: Path) -> dict[str, np.ndarray]:
    if not path.exists():
        return {}
    with np.load(path) as data:
        return dict(zip(data["keys"].tolist(), data["vectors"], strict=True))


def _save(path: Path, cache: dict[str, np.ndarray]) -> None:
    if not cache:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = np.array(list(cache))
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, keys=keys, vectors=np.stack([cache[key] for key in keys]))
    tmp.replace(path)  # 原子替换：中途被打断也不会留下半个缓存文件


@contextmanager
def embedding_cache(provider_name: str, model: str, *, queries: bool = False) -> Iterator[Any]:
    """期间该提供方的向量先查磁盘缓存（见模块说明）；产出经断路器的提供方，可用 :func:`prefill` 批量预算。"""
    path = cache_path(provider_name, model)
    guarded: Any = embedder(provider_name, model)
    if not hasattr(guarded, "inner"):
        yield guarded  # 不经断路器包装的提供方（测试里的假模型）：没有可替换的内层，不缓存
        return
    cache = _load(path)
    original = guarded.inner
    guarded.inner = _CachedEmbeddings(original, cache, queries=queries)
    try:
        yield guarded
    finally:
        guarded.inner = original
        _save(path, cache)


def prefill(guarded: Any, texts: Sequence[str], progress: Callable[[Sequence[Any], str], Any]) -> int:
    """按 ``BATCH`` 一批算好缓存里还没有的文本（经断路器与输出检查），返回计算的条数。"""
    cache = getattr(getattr(guarded, "inner", None), "cache", None)
    if cache is None:
        return 0
    todo = list(dict.fromkeys(text for text in texts if _key(text) not in cache))
    for batch in progress([todo[i:i + BATCH] for i in range(0, len(todo), BATCH)], "预计算向量"):
        guarded.embed_documents(batch)
    return len(todo)
