"""Prometheus 指标（名称与类型是对外契约，见 docs/INVARIANTS.md 的 METRIC-NAMES）。

多进程部署（gunicorn 多 worker + django-q2 worker）时，``manage.py serve`` 会设置
``PROMETHEUS_MULTIPROC_DIR``，计数器与直方图写入共享目录，由 ``/metrics`` 汇总；
``knowledge_bases_active`` 与 ``chunks_total`` 是数据库中的事实，抓取时直接查询（``ops.selectors``
的 collector，由 ``/metrics`` 视图传给 ``render_latest``），因此无论有几个进程都不会出现各进程各报一份的问题。
"""

from __future__ import annotations

# prometheus_client.multiprocess 在函数里导入：只在多进程模式（设置了 PROMETHEUS_MULTIPROC_DIR）时需要。
import os
from collections.abc import Iterable

import structlog
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.registry import REGISTRY, Collector

from infra.errors import is_database_unavailable

logger = structlog.get_logger("infra.metrics")

# 覆盖 10ms 到 10s（见 docs/INVARIANTS.md 的 METRIC-NAMES）
HTTP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

HTTP_REQUESTS = Counter(
    "http_requests_total", "HTTP 请求数", ["method", "endpoint", "status"]
)
HTTP_DURATION = Histogram(
    "http_request_duration_seconds", "HTTP 请求耗时（秒）", ["method", "endpoint"], buckets=HTTP_BUCKETS
)
DOCUMENT_INGESTION = Counter("document_ingestion_total", "文档摄取结果计数", ["status"])
INGEST_STAGE_SECONDS = Histogram(
    "ingestion_stage_duration_seconds", "文档摄取各阶段耗时（秒）", ["stage"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0, 600.0),
)
ITEM_WRITES = Counter("knowledge_item_writes_total", "知识条目写入结果计数（created/updated/unchanged/queued/failed）",
                      ["result"])
ITEM_CHUNKS = Counter("knowledge_item_chunks_total", "知识条目写入时重新 embedding 与复用旧向量的分块数", ["kind"])
SEARCH_STAGE_SECONDS = Histogram(
    "search_stage_duration_seconds", "检索各阶段耗时（秒）：embed、vector、fulltext、fuse、rerank、total", ["stage"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
SEARCH_REQUESTS = Counter("search_requests_total", "检索请求数（mode 为请求的检索方式）", ["mode"])
SEARCH_DEGRADED = Counter(
    "search_degraded_total",
    "检索降级次数：fulltext-only（向量路不可用）、vector-only（全文路失败）、no-retrieval、rerank-unavailable",
    ["reason"],
)
QUERY_EMBEDDING_CACHE = Counter("query_embedding_cache_requests_total", "查询向量缓存查找次数", ["result"])
CLEANUP_TASKS = Counter("cleanup_tasks_total", "知识库清理任务结束计数", ["status"])
JOB_RETRIES = Counter("job_retries_total", "后台作业因暂时性失败而自动重试的次数（ingest、cleanup）", ["kind"])
STALE_TASKS_REQUEUED = Counter("stale_tasks_requeued_total", "worker 死掉或消息丢失后被回收器重新交给队列的作业数",
                                ["kind"])
REPLICA_FALLBACKS = Counter("database_replica_fallbacks_total", "只读副本连不上、检索退回主库的次数")

# 预先创建标签组合，使从未发生过的结果也以 0 出现，PromQL 的 rate() 不会缺数据
for _status in ("completed", "failed"):
    DOCUMENT_INGESTION.labels(status=_status)
    CLEANUP_TASKS.labels(status=_status)


def observe_http_request(method: str, endpoint: str, status: int, duration: float) -> None:
    """记录一次 HTTP 请求。"""
    HTTP_REQUESTS.labels(method=method, endpoint=endpoint, status=str(status)).inc()
    HTTP_DURATION.labels(method=method, endpoint=endpoint).observe(duration)


def render_latest(*collectors: Collector) -> tuple[bytes, str]:
    """生成 /metrics 的响应体；多进程模式下汇总共享目录里所有进程的数据。

    ``collectors`` 是抓取时才计算的指标（如应用层从数据库读出的库存数），每次抓取注册进临时注册表。
    """
    registry: CollectorRegistry
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = CollectorRegistry()
        # 单进程模式：把进程内默认注册表整体纳入
        registry.register(_DefaultRegistryProxy())
    for collector in collectors:
        registry.register(_DatabaseTolerantCollector(collector))
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _DatabaseTolerantCollector(Collector):
    """抓取时查库的 collector：数据库不可达时只缺它这几个指标，其余照常输出。

    数据库停机恰恰是最需要进程指标（请求数、错误率、耗时）的时候；整个 /metrics 跟着 503 会让 Prometheus
    连“服务在报 503”都看不到。缺的 gauge 由 Prometheus 的 absent() 发现，原因进日志。
    """

    def __init__(self, inner: Collector) -> None:
        self.inner = inner

    def collect(self) -> Iterable:  # type: ignore[type-arg]
        try:
            # 先全部取出：生成器在 generate_latest 里迭代到一半才抛，就来不及跳过了
            return list(self.inner.collect())
        except Exception as exc:
            if not is_database_unavailable(exc):
                raise
            logger.warning("metrics_collector_skipped", collector=type(self.inner).__name__,
                           reason="database_unavailable")
            return []

    def describe(self) -> Iterable:  # type: ignore[type-arg]
        return []


class _DefaultRegistryProxy(Collector):
    """把全局 REGISTRY 的内容转交给临时注册表。"""

    def collect(self) -> Iterable:  # type: ignore[type-arg]
        return REGISTRY.collect()

    def describe(self) -> Iterable:  # type: ignore[type-arg]
        return []
