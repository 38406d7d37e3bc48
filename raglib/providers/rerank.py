"""重排序（rerank）提供方：接口、配置、内置提供方、保护层与进程内缓存。

不变量见 docs/INVARIANTS.md 的 RERANK-ORDER、RERANK-FALLBACK、RERANK-CACHE。

- 提供方实现 :class:`RerankProvider`：``score(query, texts)`` 按输入顺序返回每个候选的分数。
  ``scores_are_probabilities`` 为假时分数是模型的原始 logit（任意实数），由保护层经 :func:`sigmoid`
  映射到 [0, 1]；为真时分数已经是 [0, 1] 的相关度（Cohere/Jina 的 ``relevance_score``），
  不能再过一遍 sigmoid——否则 0..1 会被压到 0.5..0.73，区分度几乎消失。
- 内置两种：``flag``（FlagEmbedding 的 ``FlagReranker``，默认 bge-reranker-v2-m3）与 ``http``
  （TEI ``/rerank`` 或 Cohere/Jina ``/v1/rerank``）。其他实现经 :func:`register_rerank_provider` 注册。
- :class:`GuardedReranker` 是调用方唯一要用的对象，``rerank(query, texts)`` 返回归一化分数：

  1. 先查 TTL-LRU 缓存（键：provider、model、query、候选文本按顺序的摘要；失败从不缓存）；
  2. 未命中时经断路器 ``rerank:{provider}:{model}`` 调用提供方，暂时性错误（超时、连接失败、5xx、
     408/429）在同一次请求内最多重试 ``retries`` 次（退避 0.05 s、0.1 s）；
  3. 任何失败（含熔断拒绝）都抛 :class:`RerankUnavailable`，调用方据此回退到融合分数。

  断路器的计数单位是“一次请求”而不是“一次尝试”：重试都在同一个 ``breaker.call`` 里进行，重试用尽
  仍失败才记一次失败。这样 ``failure_threshold=3`` 的含义就是“连续 3 个请求失败”，不会因为一个
  请求内的 3 次尝试就熔断；half-open 时放行的探测也是一次完整的（带重试的）请求。
- 模型懒加载：第一次 ``rerank`` 时在断路器里加载，加载失败（模型不存在、缺权重）同样计为一次失败，
  连续失败后熔断，不会每个请求都去重新加载一个不存在的模型。
"""

from __future__ import annotations

# torch、FlagEmbedding 在函数里导入：很重的可选依赖，只在构造 flag 重排序提供方时加载。
import hashlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import structlog
from cachetools import TTLCache
from prometheus_client import Counter, Gauge

from raglib.providers.breaker import BreakerRegistry, CircuitBreaker, CircuitOpenError
from raglib.providers.embedding_base import INPUT_REJECTED_STATUSES
from raglib.providers.http_embedding import ThreadLocalSessions, auth_headers, post_json, request_timeout
from raglib.providers.registry import Registry

logger = structlog.get_logger(__name__)

DEFAULT_MODELS: dict[str, str] = {"flag": "BAAI/bge-reranker-v2-m3"}
RERANK_APIS = ("tei", "cohere")
# 第 n 次重试前的等待（秒）；超过长度时沿用最后一个
RETRY_BACKOFF: tuple[float, ...] = (0.05, 0.1)

# ---------------------------------------------------------------- 指标

RERANK_CACHE_REQUESTS = Counter("rerank_cache_requests_total", "重排序结果缓存查找次数", ["result"])
# liveall：多进程（gunicorn，PROMETHEUS_MULTIPROC_DIR）下每个存活进程各出一条带 pid 标签的序列。
# 命中率是比值，跨进程求和没有意义，取最大/最小会掩盖冷进程；全体的命中率应由计数器在 PromQL 里算：
# sum(rate(rerank_cache_requests_total{result="hit"}[5m])) / sum(rate(rerank_cache_requests_total[5m]))。
RERANK_CACHE_HIT_RATE = Gauge("rerank_cache_hit_rate", "本进程重排序缓存命中率：hits/(hits+misses)",
                              multiprocess_mode="liveall")
# 只统计缓存未命中、交给提供方处理的请求：ok 成功，error 重试后仍失败，rejected 被断路器拒绝
RERANK_REQUESTS = Counter("rerank_requests_total", "重排序请求结果（不含缓存命中）", ["provider", "outcome"])
OUTCOMES = ("ok", "error", "rejected")

for _result in ("hit", "miss"):
    RERANK_CACHE_REQUESTS.labels(result=_result)

_stats_lock = threading.Lock()
_cache_stats = {"hit": 0, "miss": 0}


def _record_cache_lookup(hit: bool) -> None:
    result = "hit" if hit else "miss"
    RERANK_CACHE_REQUESTS.labels(result=result).inc()
    with _stats_lock:
        _cache_stats[result] += 1
        total = _cache_stats["hit"] + _cache_stats["miss"]
        RERANK_CACHE_HIT_RATE.set(_cache_stats["hit"] / total)


def rerank_cache_hit_rate() -> float:
    """本进程的缓存命中率（没有查找过时为 0）。"""
    with _stats_lock:
        total = _cache_stats["hit"] + _cache_stats["miss"]
        return _cache_stats["hit"] / total if total else 0.0


# ---------------------------------------------------------------- 纯函数


def sigmoid(x: float) -> float:
    """``1/(1+exp(-x))``，对任意大的 |x| 都不溢出：结果有限且在 [0, 1]（±inf 映射到 1/0）。

    负数一侧改写成 ``exp(x)/(1+exp(x))``，两个分支的 ``exp`` 参数都不为正，永远不会溢出。
    NaN 原样返回 NaN；保护层在调用前已把 NaN 当作提供方失败。
    """
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def candidates_digest(texts: Sequence[str]) -> str:
    """候选文本按顺序的摘要（缓存键的一部分）；每段前写长度，["ab", "c"] 与 ["a", "bc"] 不会相同。"""
    digest = hashlib.blake2b(digest_size=16)
    for text in texts:
        # surrogatepass：JSON 里可能带来孤立的代理码点，普通 utf-8 编码会抛错
        data = text.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


# ---------------------------------------------------------------- 异常、接口与配置


class RerankError(Exception):
    """提供方失败。``transient`` 为真表示重试可能成功（超时、连接失败、5xx、408/429）。"""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        # 远程服务返回的 HTTP 状态码；本地模型或连接错误时为 None
        self.status = status


class RerankUnavailable(Exception):
    """重排序暂时不可用（熔断、重试用尽、模型加载失败……）；调用方应回退，不重排。

    原始异常在 ``__cause__`` 里；被断路器拒绝时 ``retry_after`` 为距离下次探测的秒数，否则为 None。
    """

    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


@runtime_checkable
class RerankProvider(Protocol):
    """重排序提供方接口；保护层已保证不会并发进入加载，但 ``score`` 须线程安全。"""

    provider: str
    model: str
    # 为真：score 返回的已是 [0, 1] 的相关度，保护层只截断到 [0, 1]；为假：原始 logit，保护层做 sigmoid
    scores_are_probabilities: bool

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """每个候选一个分数，顺序与 ``texts`` 一致。"""
        ...


@dataclass(frozen=True)
class RerankConfig:
    """一份重排序配置；冻结且可哈希，直接作为进程内缓存的键。"""

    provider: str = "flag"
    # 空字符串表示该提供方的默认模型（flag：bge-reranker-v2-m3）；flag 为 hub id 或本地目录，
    # http 为发给服务端的模型名（cohere 风格必填，TEI 忽略）
    model: str = ""
    url: str = ""  # http：服务地址，如 http://gpu-box:8081（cohere 风格带不带 /v1 都行）
    api: str = "tei"  # http："tei"（POST /rerank）或 "cohere"（POST /v1/rerank，Jina 同）
    api_key: str = field(default="", repr=False)  # http：Bearer token；不进 repr，免得写进日志
    device: str = ""  # flag：空为有 CUDA 用 cuda，否则 cpu
    batch_size: int = 32  # flag：每次前向的候选数；http：每个请求的候选数（TEI 默认最多 32）
    max_length: int = 512  # flag：query+候选的最大 token 数（不超过模型位置编码）
    timeout: float = 10.0  # http：单次请求的读超时（秒）
    retries: int = 2  # 暂时性错误在同一次请求内的重试次数
    failure_threshold: int = 3  # 断路器：连续多少个请求失败后熔断
    reset_timeout: float = 20.0  # 断路器：熔断多少秒后放行一次探测
    cache_size: int = 1000  # 结果缓存条数；0 关闭缓存
    cache_ttl: float = 300.0  # 结果缓存有效期（秒）

    def __post_init__(self) -> None:
        if not self.model and self.provider in DEFAULT_MODELS:
            object.__setattr__(self, "model", DEFAULT_MODELS[self.provider])
        for name in ("batch_size", "max_length", "failure_threshold"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("retries", "cache_size", "reset_timeout"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.timeout <= 0 or self.cache_ttl <= 0:
            raise ValueError("timeout and cache_ttl must be > 0")
        if self.api not in RERANK_APIS:
            raise ValueError(f"api must be one of {RERANK_APIS}, got {self.api!r}")

    @property
    def breaker_name(self) -> str:
        """断路器名（也是断路器指标的 name 标签）。"""
        return f"rerank:{self.provider}:{self.model}"


# ---------------------------------------------------------------- flag：FlagReranker


class FlagRerankProvider:
    """flag：用 FlagEmbedding 的 ``FlagReranker`` 加载（hub id 或本地目录），输出 logit（未归一化）。

    推理不走 ``FlagReranker.compute_score``，而是用它加载好的 tokenizer 与模型、按它的方式编码，原因
    （FlagEmbedding 1.4.2 的 ``compute_score_single_gpu``）：

    - 每次调用都先把第一批完整前向一遍“试批大小”，再从头正式计算；候选数不超过批大小时（重排序的
      常见情形）整次推理要算两遍；
    - 试批时捕获所有 ``RuntimeError`` 并把批大小乘 3/4，持续性错误会被吞掉、最后抛出无关的异常；
    - 候选数不少于批大小时每次调用都打印 tqdm 进度条。

    编码与 ``compute_score`` 相同（query 先截到 ``max_length*3//4``，再与候选按 only_second 截断拼接），
    测试里逐元素对比两者的输出，升级 FlagEmbedding 时作为护栏。
    """

    provider = "flag"
    scores_are_probabilities = False

    def __init__(self, config: RerankConfig) -> None:
        # 延迟导入：torch/transformers（经 FlagEmbedding）是重依赖，导入要好几秒，只在加载 flag 模型时才付
        import torch
        from FlagEmbedding import FlagReranker
        from FlagEmbedding.utils.tokenizer_compat import pad_with_compat, prepare_for_model_compat

        device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        use_fp16 = device.startswith("cuda")
        # 参数名是 devices（复数）：写成 device 会被当作额外属性静默收下，设备不生效
        self._flag = FlagReranker(config.model, use_fp16=use_fp16, devices=device, normalize=False)
        # 必须持有 self._flag：它的 __del__ 会把模型搬回 CPU
        self._tokenizer = self._flag.tokenizer
        self._network: Any = self._flag.model
        if use_fp16:
            self._network.half()
        else:
            self._network.float()  # CPU 上不用半精度（与 compute_score 在 cpu 设备上的做法一致）
        self._network.to(device)
        self._network.eval()
        self._device = device
        self._torch = torch
        self._pad = pad_with_compat
        self._prepare = prepare_for_model_compat

        self.model = config.model
        # XLM-R 的位置编码从 padding_idx+1 开始，可用长度是 max_position_embeddings - 2；
        # 配置的长度超过模型能力时截短，否则超长输入会在 embedding 层越界
        positions = getattr(self._network.config, "max_position_embeddings", None)
        self.max_length = min(config.max_length, int(positions) - 2) if positions else config.max_length
        self._query_max_length = self.max_length * 3 // 4  # 与 compute_score 的默认值相同
        self._batch_size = config.batch_size
        # 推理本身用满所有核（torch 线程池），并发只会互相抢核；fast tokenizer 并发改截断参数也会报
        # "Already borrowed"，所以编码与前向都在锁里
        self._lock = threading.Lock()

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """原始 logit，顺序与输入一致；按编码长度降序分批以减少 padding。"""
        batch = list(texts)
        if not batch:
            return []
        scores = [0.0] * len(batch)
        with self._lock, self._torch.inference_mode():
            items = self._encode_pairs(query, batch)
            order = sorted(range(len(items)), key=lambda i: -len(items[i]["input_ids"]))
            for start in range(0, len(order), self._batch_size):
                indices = order[start:start + self._batch_size]
                inputs = self._pad(self._tokenizer, [items[i] for i in indices], padding=True,
                                   return_tensors="pt").to(self._device)
                logits = self._network(**inputs, return_dict=True).logits.view(-1).float().cpu().tolist()
                for index, value in zip(indices, logits, strict=True):
                    scores[int(index)] = float(value)
        return scores

    def _encode_pairs(self, query: str, texts: list[str]) -> list[dict[str, Any]]:
        query_ids = self._tokenizer([query], add_special_tokens=False, max_length=self._query_max_length,
                                    truncation=True)["input_ids"][0]
        text_ids = self._tokenizer(texts, add_special_tokens=False, max_length=self.max_length,
                                   truncation=True)["input_ids"]
        return [self._prepare(self._tokenizer, query_ids, ids, truncation="only_second", max_length=self.max_length,
                              padding=False) for ids in text_ids]


# ---------------------------------------------------------------- http：TEI / Cohere / Jina


class HttpRerankProvider:
    """远程重排序服务；候选按 ``batch_size`` 分批请求，结果按 ``index`` 写回输入位置（服务端可乱序返回）。

    - ``tei``：``POST {url}/rerank``，``raw_scores: true`` 取 logit（``scores_are_probabilities=False``）；
    - ``cohere``（Jina 同）：``POST {url}/v1/rerank``，``relevance_score`` 已在 [0, 1]
      （``scores_are_probabilities=True``，保护层不再做 sigmoid）。

    错误分类与 http embedding 相同（共用 :func:`~raglib.providers.http_embedding.post_json`）；响应形状不对
    （条数不符、缺 index、index 重复或越界、分数不是数）算作永久性错误：同一个服务重试也会得到同样的
    响应（多半是接口风格配错了），不值得在一次请求里重试，但仍计入断路器。
    """

    provider = "http"

    def __init__(self, config: RerankConfig) -> None:
        if not config.url:
            raise ValueError("the http rerank provider needs a url (RAG_RERANK_URL)")
        self.model = config.model
        self.api = config.api
        self.scores_are_probabilities = config.api == "cohere"
        base = config.url.rstrip("/")
        if config.api == "tei":
            self.endpoint = f"{base}/rerank"
        else:
            # Cohere/Jina 的 base_url 习惯写到 /v1 为止，两种写法都接受
            self.endpoint = f"{base}/rerank" if base.endswith("/v1") else f"{base}/v1/rerank"
        self._timeout = request_timeout(config.timeout)
        self._sessions = ThreadLocalSessions(auth_headers(config.api_key))
        self._batch_size = config.batch_size

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """每批一个请求，按输入顺序拼接。"""
        batch = list(texts)
        scores: list[float] = []
        for start in range(0, len(batch), self._batch_size):
            scores.extend(self._score_batch(query, batch[start:start + self._batch_size]))
        return scores

    def _score_batch(self, query: str, texts: list[str]) -> list[float]:
        if self.api == "tei":
            # truncate：超长候选由服务端截断（与本地模型一致），而不是整批 413
            body = self._post({"query": query, "texts": texts, "raw_scores": True, "truncate": True})
            return _indexed_scores(body, len(texts), score_key="score")
        body = self._post({"model": self.model, "query": query, "documents": texts, "top_n": len(texts)})
        return _indexed_scores(body.get("results") if isinstance(body, dict) else None, len(texts),
                               score_key="relevance_score")

    def _post(self, payload: dict[str, Any]) -> Any:
        return post_json(self._sessions.get(), self.endpoint, payload, timeout=self._timeout,
                         service="rerank server", error=RerankError)


def _indexed_scores(items: Any, count: int, *, score_key: str) -> list[float]:
    """``[{"index": i, score_key: s}, ...]``（任意顺序）→ 按 index 排好的分数；每个 index 须恰好出现一次。"""
    if not isinstance(items, list) or len(items) != count:
        got = f"{len(items)} results" if isinstance(items, list) else f"a {type(items).__name__}"
        raise RerankError(f"rerank server returned {got} for {count} texts", transient=False)
    scores: list[float | None] = [None] * count
    for item in items:
        index = item.get("index") if isinstance(item, dict) else None
        value = item.get(score_key) if isinstance(item, dict) else None
        # bool 是 int 的子类：JSON 的 true 不能当作 index 1 或分数 1.0
        if type(index) is not int or not 0 <= index < count or scores[index] is not None:
            raise RerankError(f"rerank server returned a missing, duplicate or out-of-range index: {item!r:.200}",
                              transient=False)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise RerankError(f"rerank server returned no numeric {score_key!r}: {item!r:.200}", transient=False)
        scores[index] = float(value)
    # 条数相等且 index 不重复，所以每个位置都已填上
    return [float(s) for s in scores if s is not None]


# ---------------------------------------------------------------- 保护层：缓存 + 重试 + 断路器

CacheKey = tuple[str, str, str, str]


def counts_as_failure(exc: BaseException) -> bool:
    """断路器的失败判定：除“服务端拒绝了这批输入”（400/413/422）外，所有异常都计入。"""
    if isinstance(exc, RerankError) and exc.status in INPUT_REJECTED_STATUSES:
        return False
    return isinstance(exc, Exception)


def is_transient(exc: BaseException) -> bool:
    """是否值得在同一次请求里重试：只有标明 ``transient`` 的 :class:`RerankError`。

    本地模型抛出的其他异常（如 CUDA OOM、加载失败）不重试：立刻再算一遍多半同样失败，还要再占满 CPU/GPU。
    """
    return isinstance(exc, RerankError) and exc.transient


class GuardedReranker:
    """调用方使用的重排序入口：缓存、懒加载、重试与断路器，失败统一为 :class:`RerankUnavailable`。"""

    def __init__(
        self,
        config: RerankConfig,
        load: Callable[[], RerankProvider],
        *,
        breaker: CircuitBreaker,
        sleep: Callable[[float], None] = time.sleep,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.provider = config.provider
        self.model = config.model
        self.breaker = breaker
        self._load = load
        self._inner: RerankProvider | None = None
        self._load_lock = threading.Lock()
        self._sleep = sleep
        self._cache: TTLCache[CacheKey, tuple[float, ...]] | None = None
        if config.cache_size:
            self._cache = TTLCache(maxsize=config.cache_size, ttl=config.cache_ttl, timer=timer)
        # TTLCache 的读取也会清理过期项（写操作），不是线程安全的
        self._cache_lock = threading.Lock()
        for outcome in OUTCOMES:
            RERANK_REQUESTS.labels(provider=self.provider, outcome=outcome)

    @property
    def loaded(self) -> bool:
        """模型（或 http 客户端）是否已加载。"""
        return self._inner is not None

    def rerank(self, query: str, texts: Sequence[str]) -> list[float]:
        """归一化到 [0, 1] 的分数，顺序与 ``texts`` 一致；空 ``texts`` 直接返回 ``[]``，不查缓存不调用。

        不可用时抛 :class:`RerankUnavailable`；参数类型不对（调用方的 bug）抛 ``TypeError``。
        """
        batch = _checked_inputs(query, texts)
        if not batch:
            return []
        key: CacheKey = (self.provider, self.model, query, candidates_digest(batch))
        if self._cache is not None:
            with self._cache_lock:
                cached = self._cache.get(key)
            _record_cache_lookup(hit=cached is not None)
            if cached is not None:
                return list(cached)
        scores = self._guarded(self._score_with_retries, query, batch)
        if self._cache is not None:
            with self._cache_lock:
                self._cache[key] = tuple(scores)
        return scores

    def warm_up(self) -> None:
        """提前加载模型（如启动时），同样经断路器但不计入请求指标；失败抛 :class:`RerankUnavailable`。"""
        self._guarded(self._provider, record=False)

    def _guarded(self, fn: Callable[..., Any], *args: Any, record: bool = True) -> Any:
        try:
            result = self.breaker.call(fn, *args)
        except CircuitOpenError as exc:
            self._record("rejected", record)
            raise RerankUnavailable(str(exc), retry_after=exc.retry_after) from exc
        except Exception as exc:
            self._record("error", record)
            logger.warning("rerank_failed", reranker=self.breaker.name, error=str(exc),
                           error_type=type(exc).__name__)
            raise RerankUnavailable(f"{self.breaker.name} failed: {type(exc).__name__}: {exc}") from exc
        self._record("ok", record)
        return result

    def _record(self, outcome: str, record: bool) -> None:
        if record:
            RERANK_REQUESTS.labels(provider=self.provider, outcome=outcome).inc()

    def _score_with_retries(self, query: str, texts: list[str]) -> list[float]:
        """在断路器内执行：一次请求 = 首次尝试 + 最多 ``retries`` 次重试，整体只算一次成功或失败。"""
        attempt = 0
        while True:
            try:
                inner = self._provider()
                return _normalised(inner, inner.score(query, texts), len(texts), self.breaker.name)
            except Exception as exc:
                if attempt >= self.config.retries or not is_transient(exc):
                    raise
                delay = RETRY_BACKOFF[min(attempt, len(RETRY_BACKOFF) - 1)]
                attempt += 1
                logger.info("rerank_retry", reranker=self.breaker.name, attempt=attempt, delay=delay,
                            error=str(exc))
                self._sleep(delay)

    def _provider(self) -> RerankProvider:
        """懒加载提供方；并发的首次调用只加载一次，失败不缓存（下次请求再试，由断路器限流）。"""
        inner = self._inner
        if inner is not None:
            return inner
        with self._load_lock:
            if self._inner is None:
                try:
                    self._inner = self._load()
                except Exception as exc:
                    raise RerankError(f"could not load rerank model {self.provider}:{self.model}: "
                                      f"{type(exc).__name__}: {exc}", transient=False) from exc
                logger.info("rerank_model_loaded", reranker=self.breaker.name)
            return self._inner

    def clear_cache(self) -> None:
        """清空结果缓存。"""
        if self._cache is not None:
            with self._cache_lock:
                self._cache.clear()

    def __repr__(self) -> str:
        return f"GuardedReranker({self.provider}:{self.model}, loaded={self.loaded})"


def _normalised(inner: RerankProvider, raw: Sequence[float], count: int, name: str) -> list[float]:
    """提供方的输出契约（条数、无 NaN），并归一化到 [0, 1]。违反契约在断路器内抛出，算一次失败。"""
    scores = [float(s) for s in raw]
    if len(scores) != count:
        raise RerankError(f"{name} returned {len(scores)} scores for {count} texts", transient=False)
    if any(math.isnan(s) for s in scores):
        raise RerankError(f"{name} returned NaN scores", transient=False)
    if inner.scores_are_probabilities:
        # 已是概率：只截断（个别服务会返回略超出 [0, 1] 的浮点误差），绝不再做 sigmoid
        return [min(1.0, max(0.0, s)) for s in scores]
    return [sigmoid(s) for s in scores]


def _checked_inputs(query: str, texts: Sequence[str]) -> list[str]:
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    if isinstance(texts, str):
        raise TypeError("rerank expects a sequence of str, got a single str")
    batch = list(texts)
    for i, text in enumerate(batch):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
    return batch


# ---------------------------------------------------------------- 注册表与进程内缓存

RerankFactory = Callable[[RerankConfig], RerankProvider]

_FACTORIES: Registry[RerankFactory] = Registry("rerank", {"flag": FlagRerankProvider, "http": HttpRerankProvider})


def register_rerank_provider(name: str, factory: RerankFactory) -> None:
    """注册（或替换）一种提供方；``factory(config)`` 负责加载模型，可能较慢，只在首次重排序时调用一次。"""
    _FACTORIES.register(name, factory)


def available_rerank_providers() -> list[str]:
    """已注册的提供方名字。"""
    return _FACTORIES.names()


_rerankers: dict[RerankConfig, GuardedReranker] = {}
_breakers = BreakerRegistry()
_registry_lock = threading.Lock()


def rerank_breaker(config: RerankConfig) -> CircuitBreaker:
    """该配置对应的断路器（不存在则创建）。"""
    return _breakers.for_config(config, is_failure=counts_as_failure)


def get_reranker(config: RerankConfig) -> GuardedReranker:
    """取该配置的重排序入口（每个进程每份配置一个实例）；很便宜，模型在第一次 ``rerank`` 时才加载。

    未注册的提供方名抛 ``ValueError``。
    """
    factory = _FACTORIES.lookup(config.provider)
    breaker = rerank_breaker(config)
    with _registry_lock:
        reranker = _rerankers.get(config)
        if reranker is None:
            reranker = GuardedReranker(config, lambda: factory(config), breaker=breaker)
            _rerankers[config] = reranker
        return reranker


def loaded_rerank_models() -> list[dict[str, object]]:
    """本进程已加载的重排序模型（供 /ready 展示）：``[{"provider", "model"}]``，去重并排序。"""
    with _registry_lock:
        rerankers = list(_rerankers.values())
    seen = {(r.provider, r.model) for r in rerankers if r.loaded}
    return [{"provider": p, "model": m} for p, m in sorted(seen)]


def clear_rerankers() -> None:
    """清空实例（连同模型与结果缓存）、断路器与本进程的命中率统计（测试隔离用）。"""
    with _registry_lock:
        _rerankers.clear()
        _breakers.clear()
    with _stats_lock:
        _cache_stats["hit"] = _cache_stats["miss"] = 0
        RERANK_CACHE_HIT_RATE.set(0)
