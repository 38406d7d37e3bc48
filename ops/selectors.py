"""运维面的读取：指标用的库存计数、就绪检查。"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django_q.conf import Conf
from django_q.status import Stat
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from infra.embedders import default_embedder
from ops.warmup import ENGINE_KINDS, WarmState, process_engines, worker_warm_states
from raglib.providers.embedding import loaded_embedding_models
from raglib.providers.rerank import loaded_rerank_models
from search.rerankers import rerank_config

logger = structlog.get_logger(__name__)


@dataclass(frozen=True)
class InventoryCounts:
    knowledge_bases_active: int
    chunks_total: int
    # 还没插进知识库自己的图的分块（search.ann.flush_pending 插）：快队列的 worker 停了时它停在上限
    # （RAG_ANN_PENDING_MAX_CHUNKS，按知识库），写入退回直接插图，检索每个查询多扫这些分块
    chunks_ann_pending: int


def inventory_counts() -> InventoryCounts:
    """enabled 知识库数、分块总数与还没进图的分块数（一次查询；最后一项数部分索引 document_chunks_pending_idx）。"""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM knowledge_bases WHERE status = 'enabled'),"
            " (SELECT count(*) FROM document_chunks),"
            " (SELECT count(*) FROM document_chunks WHERE ann_pending)"
        )
        active, chunks, pending = cursor.fetchone()
    return InventoryCounts(knowledge_bases_active=int(active), chunks_total=int(chunks),
                           chunks_ann_pending=int(pending))


class DatabaseGaugeCollector(Collector):
    """抓取时从数据库读出的 Gauge。"""

    def collect(self) -> Iterable[GaugeMetricFamily]:
        counts = inventory_counts()
        yield GaugeMetricFamily("knowledge_bases_active", "状态为 enabled 的知识库数量",
                                value=counts.knowledge_bases_active)
        yield GaugeMetricFamily("chunks_total", "向量库中的 chunk 总数", value=counts.chunks_total)
        yield GaugeMetricFamily("chunks_ann_pending", "还没插进知识库自己的 HNSW 图的 chunk 数（检索对它们精确扫描）",
                                value=counts.chunks_ann_pending)

    def describe(self) -> Iterable[GaugeMetricFamily]:
        # 返回空描述：注册时不触发数据库查询
        return []


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


def check_database() -> CheckResult:
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        version = str(cursor.fetchone()[0]).split(" on ")[0]
    return CheckResult("database", True, version)


def check_pgvector() -> CheckResult:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = cursor.fetchone()
    if row is None:
        return CheckResult("pgvector", False, "The pgvector extension is not installed in this database")
    return CheckResult("pgvector", True, f"vector {row[0]}")


def check_migrations() -> CheckResult:
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        pending = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
        return CheckResult("migrations", False,
                           f"{len(plan)} database migration(s) not applied (run: manage.py migrate): {pending}")
    return CheckResult("migrations", True, "all applied")


def _running_clusters() -> list[Stat]:
    return [s for s in Stat.get_all() if s.status not in ("Stopped", "Stopping")]


def check_worker() -> CheckResult:
    """django-q2 集群的心跳写在共享的数据库缓存里；至少一个 worker 已加载完模型才算在线。

    只要求“至少一个”而不是“全部”：django-q2 回收（recycle）worker 时新进程要重新加载模型，
    要求全部会让 /ready 在正常运行中反复变成 503。
    """
    if Conf.SYNC:
        return CheckResult("worker", True, "tasks run synchronously (RAG_QUEUE_SYNC=true)")
    clusters = _running_clusters()
    if not clusters:
        return CheckResult("worker", False, "No background worker is running (start it with: manage.py qcluster)")
    workers = [(cluster.host, pid) for cluster in clusters for pid in cluster.workers]
    states = worker_warm_states(workers)
    warm = [state for state in states if state.ok]
    if not warm:
        if states:
            return CheckResult("worker", False, "The background worker could not load the embedding model or the "
                                                "OCR engine; see the worker log")
        return CheckResult("worker", False, "The background worker is still loading the embedding model and the "
                                            "OCR engine")
    slowest = max(state.seconds for state in warm)
    return CheckResult("worker", True, f"{len(clusters)} cluster(s), {len(warm)}/{len(workers)} worker process(es) "
                                       f"loaded {warm[0].loaded} (in {slowest:.1f} s)")


def check_models() -> CheckResult:
    """默认 embedding 模型能加载（首次调用时加载并常驻本进程），并列出本进程已加载的模型。

    重排序模型只报告、不在探针里加载：gunicorn worker 启动时已预热（``post_worker_init``），没加载上时检索
    仍可用（按融合顺序返回），不该因此把整个服务标成未就绪；但 detail 要让人看出第一个检索会不会替大家等加载。
    """
    default_embedder()
    loaded = ", ".join(f"{m['provider']}:{m['model']} ({m['dimension']}-d)" for m in loaded_embedding_models())
    config = rerank_config()
    if config is None:
        rerank = "off"
    elif any((m["provider"], m["model"]) == (config.provider, config.model) for m in loaded_rerank_models()):
        rerank = f"{config.provider}:{config.model}"
    else:
        rerank = f"{config.provider}:{config.model} not loaded yet (loads on the first search)"
    return CheckResult("models", True, f"embedding: {loaded}; rerank: {rerank}")


def warm_engines() -> dict[str, dict[str, list[str]]]:
    """/ready 的 ``warm`` 字段：按进程种类列出已预热的引擎（``ops.warmup.ENGINE_KINDS`` → ``["提供方:模型", …]``）。

    - ``web``：答这次请求的 web 进程自己（每个 gunicorn worker 各自加载，答案因进程而异）；
    - ``worker``：每个已登记预热成功的 django-q2 worker 都有的引擎（任务落到哪个 worker 上都不用等）；
      任务在 web 进程里同步执行（``RAG_QUEUE_SYNC=true``）时没有这一项，读不到 worker 状态时也没有（只记日志）。
    """
    report = {"web": process_engines()}
    if Conf.SYNC:
        return report
    try:
        with transaction.atomic():
            workers = [(cluster.host, pid) for cluster in _running_clusters() for pid in cluster.workers]
            states = [state for state in worker_warm_states(workers) if state.ok]
    except Exception:
        logger.warning("warm_engines_unreadable", exc_info=True)
        return report
    report["worker"] = _common_engines(states)
    return report


def _common_engines(states: list[WarmState]) -> dict[str, list[str]]:
    """各 worker 都已预热的引擎；没有预热成功的 worker 时各项为空。"""
    common: dict[str, list[str]] = {}
    for kind in ENGINE_KINDS:
        sets = [set(state.engines.get(kind, [])) for state in states]
        common[kind] = sorted(set.intersection(*sets)) if sets else []
    return common


# 检查项与它抛异常时给人看的说明：绝不把 SQL、驱动报错原文放进公开的探针响应，原文只进日志
READINESS_CHECKS: tuple[tuple[Callable[[], CheckResult], str], ...] = (
    (check_database, "The database cannot be reached"),
    (check_pgvector, "Could not check whether the pgvector extension is installed"),
    (check_migrations, "Could not read which database migrations have been applied"),
    (check_worker, "Could not read the background worker status from the database (run: manage.py migrate)"),
    (check_models, "The default embedding model could not be loaded"),
)


def readiness() -> list[CheckResult]:
    """依次执行就绪检查；一项抛异常即记为失败（说明用固定文字，异常写日志），不影响其他项。"""
    results = []
    for check, failure in READINESS_CHECKS:
        name = check.__name__.removeprefix("check_")
        try:
            # 每项一个保存点：一项查询出错不会让同一事务里后面的检查跟着失败
            with transaction.atomic():
                results.append(check())
        except Exception:
            logger.warning("readiness_check_failed", check=name, exc_info=True)
            results.append(CheckResult(name, False, failure))
    return results
