"""运维面的读取：指标用的库存计数、就绪检查。"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


@dataclass(frozen=True)
class InventoryCounts:
    knowledge_bases_active: int
    chunks_total: int


def inventory_counts() -> InventoryCounts:
    """enabled 知识库数与分块总数（一次查询）。"""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM knowledge_bases WHERE status = 'enabled'),"
            " (SELECT count(*) FROM document_chunks)"
        )
        active, chunks = cursor.fetchone()
    return InventoryCounts(knowledge_bases_active=int(active), chunks_total=int(chunks))


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
        return CheckResult("pgvector", False, "extension 'vector' is not installed in this database")
    return CheckResult("pgvector", True, f"vector {row[0]}")


def check_migrations() -> CheckResult:
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        pending = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
        return CheckResult("migrations", False, f"{len(plan)} unapplied migration(s): {pending}")
    return CheckResult("migrations", True, "all applied")


def check_worker() -> CheckResult:
    """django-q2 集群的心跳写在共享的数据库缓存里；有一个集群在报告即视为 worker 在线。"""
    from django_q.conf import Conf
    from django_q.status import Stat

    if Conf.SYNC:
        return CheckResult("worker", True, "tasks run synchronously (RAG_QUEUE_SYNC=true)")
    clusters = [s for s in Stat.get_all() if s.status not in ("Stopped", "Stopping")]
    if not clusters:
        return CheckResult("worker", False, "no django-q2 worker cluster is running")
    workers = sum(len(s.workers) for s in clusters)
    return CheckResult("worker", True, f"{len(clusters)} cluster(s), {workers} worker process(es)")


def check_models() -> CheckResult:
    """默认 embedding 模型能加载（首次调用时加载并常驻本进程），并列出本进程已加载的模型。"""
    from search.embedders import default_embedder
    from search.providers.embedding import loaded_embedding_models

    default_embedder()
    loaded = ", ".join(f"{m['provider']}:{m['model']} ({m['dimension']}-d)" for m in loaded_embedding_models())
    return CheckResult("models", True, f"embedding: {loaded}")


READINESS_CHECKS = (check_database, check_pgvector, check_migrations, check_worker, check_models)


def readiness() -> list[CheckResult]:
    """依次执行就绪检查；一项抛异常即记为失败，不影响其他项。"""
    results = []
    for check in READINESS_CHECKS:
        name = check.__name__.removeprefix("check_")
        try:
            results.append(check())
        except Exception as exc:
            results.append(CheckResult(name, False, f"{type(exc).__name__}: {exc}"))
    return results
