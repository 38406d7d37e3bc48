"""后台任务入口（django-q2 按名字调用，只接收 id，可重复执行）与周期任务。

- 知识库清理 ``run_cleanup``（执行过程见 ``ops.cleanup``）与知识库 HNSW 索引同步 ``sync_vector_indexes``；
- 全文引擎的 L0 合并成段 ``compact_fulltext``（写入后按知识库入队，另有每分钟的定时任务）；
- 回收孤儿任务：

worker 被 SIGKILL、机器重启、入队前进程崩溃，都可能留下“状态是 pending/running、却没有人在做”
的任务行。这里每分钟扫描一次（在快队列上执行，不排在长摄取后面）：
- 清理任务：超过 RAG_STALE_TASK_SECONDS 无进展、且没有执行者持有其知识库的 advisory lock 的，重新入队
  （清理按批删除、幂等，即使数据库重启释放了锁、两个执行者短暂并存，也只是删同一批行）。判断“活着”看锁而不看
  已运行多久：清理按 RAG_MAINTENANCE_TIMEOUT（小时级）计时，先删倒排的那一段（1M 分块约一小时）不更新
  updated_at，只要执行者的连接还在、锁还在，就不会被当成孤儿；
- 文档：租约过期未续的，收回租约后重新入队或置为失败（见 reap_stale_documents）；
  超过 RAG_STALE_TASK_SECONDS 还没人开始处理的，再入队一次（见 requeue_waiting_documents）。
  停止服务不在此列：收到停止信号的 worker 在检查点交还租约、自己把文档原样放回队列（documents.ingestion，
  GRACEFUL-STOP-NOT-A-DEATH），这里看到的过期租约只来自真的死掉的 worker。
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import structlog
from django.apps import apps as global_apps
from django.apps.registry import Apps
from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from documents.ingestion import INGEST_TASK_FUNC, ingestion_queue
from documents.models import Document
from infra import metrics
from infra.context import task_context
from infra.locks import is_locked
from infra.retry import database_ready
from knowledge.models import CleanupTask
from knowledge.services import CLEANUP_TASK_FUNC, cleanup_q_options
from ops.cleanup import cleanup_run, lock_key
from search import segments
from search.ann import kb_indexes_sync
from search.relevance import relevance_refresh

logger = structlog.get_logger(__name__)

REAPER_SCHEDULE_NAME = "ops.reap_stale_tasks"

# 索引同步的定时调度（迁移 knowledge.0005 建立，每 5 分钟一次）
VECTOR_INDEX_SCHEDULE = "knowledge.sync_vector_indexes"
VECTOR_INDEX_TASK_FUNC = "ops.tasks.sync_vector_indexes"
# 相关概率模型的定时检查（迁移 ops.0005 建立，每 10 分钟一次）
RELEVANCE_SCHEDULE = "search.refresh_relevance_profiles"
RELEVANCE_TASK_FUNC = "ops.tasks.refresh_relevance_profiles"
# 全文 L0 的定时合并（迁移 ops.0006 建立，每分钟一次，快队列）
FULLTEXT_COMPACT_SCHEDULE = "search.compact_fulltext"
# 按维护任务上限（RAG_MAINTENANCE_TIMEOUT）计时的调度：名字 → 任务函数
MAINTENANCE_SCHEDULES = {VECTOR_INDEX_SCHEDULE: VECTOR_INDEX_TASK_FUNC, RELEVANCE_SCHEDULE: RELEVANCE_TASK_FUNC}


def run_cleanup(task_id: str, attempt: int = 1, request_id: str | None = None) -> None:
    """清理一个已删除知识库的文档、分块与向量。"""
    with task_context("cleanup", request_id, cleanup_task_id=task_id, attempt=attempt):
        # 数据库重启过的话，worker 手里的连接已经死了：先换一条能用的
        database_ready()
        cleanup_run(task_id=uuid.UUID(task_id), attempt=attempt)


def sync_vector_indexes() -> None:
    """按分块数为大知识库建或删自己的 HNSW 索引（``search.ann``）；定时执行，幂等。"""
    with task_context("ann_index_sync", None):
        kb_indexes_sync()


def refresh_relevance_profiles() -> None:
    """为新的或变化较大的知识库（重新）拟合相关概率模型（``search.relevance``）；定时执行，幂等。"""
    with task_context("relevance_refresh", None):
        fitted = relevance_refresh()
        if fitted:
            logger.info("relevance_profiles_refreshed", knowledge_bases=[str(kb.id) for kb in fitted])


def compact_fulltext(kb_id: str | None = None, due_only: bool = False, request_id: str | None = None) -> None:
    """把全文引擎的 L0 合并成段（``search.segments``）：定时任务每分钟合并所有知识库的；写入分块后按知识库
    入队的（``due_only``）只在 L0 攒够 ``RAG_FULLTEXT_L0_MAX_CHUNKS`` 时合并。幂等；同一知识库正在合并就跳过。"""
    with task_context("fulltext_compact", request_id, kb_id=kb_id):
        done = segments.compact_due(kb_id=uuid.UUID(kb_id) if kb_id else None,
                                    min_chunks=settings.FULLTEXT_L0_MAX_CHUNKS if due_only else 1)
        for kb, result in done.items():
            logger.info("fulltext_compacted", kb_id=str(kb), chunks=result.chunks, segments=result.segments,
                        merged=result.merged, purged=result.purged)


def maintenance_schedule_refresh(*, using: str, apps: Apps = global_apps, **_: Any) -> None:
    """让维护任务的调度（索引同步、相关概率模型）按 ``RAG_MAINTENANCE_TIMEOUT`` 计时（post_migrate 信号，
    见 ``ops.apps``）。

    百万分块的库建一次图要 40 分钟以上，按集群默认的 ``RAG_TASK_TIMEOUT`` 计时会在建完之前被杀、下一轮重来。
    调度行由迁移建立，迁移只跑一次，而超时是部署时的环境变量：所以每次 migrate（``serve`` 每次启动都跑）
    把当前值写进调度的 ``q_options``，django-q2 调度器入队时取出作为这个任务的 timeout。只更新、不新建：
    调度被人删掉就是不要它。``flush`` 也发这个信号，但不带 ``apps``：那时用当前的模型。
    同时写入任务函数的当前路径：这个任务原在 ``knowledge.tasks``，迁到任务层 ``ops.tasks`` 之后，
    旧部署里的调度行由这里改名，不必为一个字符串再加迁移。
    """
    try:
        schedule = apps.get_model("django_q", "Schedule")
    except LookupError:
        return  # django_q 的表还没建（或已退回零）
    for name, func in MAINTENANCE_SCHEDULES.items():
        schedule.objects.using(using).filter(name=name).update(
            func=func, kwargs=repr({"q_options": {"timeout": settings.MAINTENANCE_TIMEOUT}}))


def requeue_stale_cleanups(*, stale_after: timedelta) -> list[str]:
    """重新入队无人执行的清理任务，返回其 id 列表。"""
    # 调用时才取 django_q.tasks.async_task：测试在模块上替换它来截获入队（见 tests 的 queued 列表）
    from django_q.tasks import async_task

    cutoff = timezone.now() - stale_after
    candidates = CleanupTask.objects.filter(
        status__in=[CleanupTask.Status.PENDING, CleanupTask.Status.RUNNING], updated_at__lt=cutoff
    ).filter(
        # 已安排自动重试且时间未过期的，交给 Schedule；Schedule 丢失（过期很久）才由这里接手
        Q(next_retry_at__isnull=True) | Q(next_retry_at__lt=cutoff)
    )
    requeued = []
    for task in candidates:
        if is_locked(lock_key(task.knowledge_base_id)):
            continue
        # 先刷新 updated_at：队列积压时不至于每分钟重复入队
        CleanupTask.objects.filter(pk=task.pk).update(updated_at=timezone.now())
        async_task(CLEANUP_TASK_FUNC, str(task.id), attempt=max(task.attempts, 1),
                   request_id=task.request_id or None, **cleanup_q_options())
        metrics.STALE_TASKS_REQUEUED.labels(kind="cleanup").inc()
        logger.warning("stale_task_requeued", kind="cleanup", cleanup_task_id=str(task.id), status=task.status)
        requeued.append(str(task.id))
    return requeued


# 弄死 worker 几次就判定文件本身有害：第一次可能是巧合（别的任务占满内存、机器掉电），第二次不再给机会。
# 停止服务（部署、重启）不算：优雅停止的 worker 交还了租约；只有等不到检查点就被 SIGKILL 的那一次才会算
MAX_WORKER_DEATHS = 2


def reap_stale_documents(*, stale_after: timedelta) -> list[str]:
    """处理中途 worker 死掉的文档（租约过期超过 stale_after 未续）：重新入队（计为一次新尝试）；
    弄死过两次 worker 或尝试用尽则置为失败。优雅停止的 worker 已交还租约，它的文档不会出现在这里。

    只看持有过租约的文档：排队等待 worker 的文档没有租约，它们没有死。收回租约用一条带条件的 UPDATE，
    与仍活着的执行者续期互斥——续上了就不收回；收回后那个执行者提交时核对令牌失败，结果作废。
    """
    # 调用时才取 django_q.tasks.async_task：测试在模块上替换它来截获入队（见 tests 的 queued 列表）
    from django_q.tasks import async_task

    cutoff = timezone.now() - stale_after
    candidates = Document.objects.exclude(lease_owner="").filter(lease_expires_at__lt=cutoff).filter(
        Q(status=Document.Status.PROCESSING) | Q(reindex_status=Document.Reindex.RUNNING)
    )
    handled = []
    for document in candidates:
        reclaimed = Document.objects.filter(
            pk=document.pk, lease_owner=document.lease_owner, lease_expires_at__lt=cutoff
        ).update(lease_owner="", lease_expires_at=None, stage="", worker_deaths=F("worker_deaths") + 1,
                 updated_at=timezone.now())
        if not reclaimed:
            continue
        deaths = document.worker_deaths + 1
        attempt = document.attempts + 1
        metrics.STALE_TASKS_REQUEUED.labels(kind="ingestion").inc()
        if deaths >= MAX_WORKER_DEATHS or attempt > settings.INGEST_MAX_RETRIES + 1:
            _fail_dead_document(document, deaths)
        else:
            async_task(INGEST_TASK_FUNC, str(document.id), attempt=attempt,
                       request_id=document.request_id or None, cluster=ingestion_queue(document))
            logger.warning("stale_document_requeued", document_id=str(document.id), attempt=attempt,
                           worker_deaths=deaths)
        handled.append(str(document.id))
    return handled


def _fail_dead_document(document: Document, deaths: int) -> None:
    if deaths >= MAX_WORKER_DEATHS:
        message = (f"The worker processing this document stopped unexpectedly {deaths} times (last during "
                   f"'{document.stage}'); the file is not processed again so that it cannot bring down more workers")
    else:
        message = (f"The worker processing this document stopped unexpectedly during "
                   f"'{document.stage}' ({document.attempts} attempts); giving up")
    if document.status == Document.Status.PROCESSING:
        Document.objects.filter(pk=document.pk).update(
            status=Document.Status.FAILED, error_message=message, finished_at=timezone.now(),
            updated_at=timezone.now())
    else:
        Document.objects.filter(pk=document.pk).update(
            reindex_status=Document.Reindex.FAILED, updated_at=timezone.now(),
            error_message=f"Re-indexing failed; the previous chunks are still served. {message}")
    metrics.DOCUMENT_INGESTION.labels(status="failed").inc()
    logger.error("stale_document_failed", document_id=str(document.id), stage=document.stage,
                 worker_deaths=deaths)


def requeue_waiting_documents(*, stale_after: timedelta) -> list[str]:
    """等了 stale_after 还没有 worker 开始处理的文档（没有租约、未安排重试）再入队一次。

    worker 从代理取走任务后、开始处理前被杀，任务要等代理的重投递（RAG_TASK_TIMEOUT + 60 秒）才会回来；
    这里让它们早些回到队列。重复入队无害：先到的那份处理文档，后到的看到已完成或租约在手就跳过。
    """
    # 调用时才取 django_q.tasks.async_task：测试在模块上替换它来截获入队（见 tests 的 queued 列表）
    from django_q.tasks import async_task

    cutoff = timezone.now() - stale_after
    candidates = Document.objects.filter(
        Q(status=Document.Status.PROCESSING) | Q(reindex_status=Document.Reindex.QUEUED),
        lease_owner="", stage="", updated_at__lt=cutoff,
    ).filter(Q(next_retry_at__isnull=True) | Q(next_retry_at__lt=cutoff))
    requeued = []
    for document in candidates:
        # 先刷新 updated_at：队列积压时不至于每分钟重复入队
        Document.objects.filter(pk=document.pk).update(updated_at=timezone.now())
        async_task(INGEST_TASK_FUNC, str(document.id), attempt=max(document.attempts, 1),
                   request_id=document.request_id or None, cluster=ingestion_queue(document))
        metrics.STALE_TASKS_REQUEUED.labels(kind="ingestion").inc()
        logger.warning("waiting_document_requeued", document_id=str(document.id))
        requeued.append(str(document.id))
    return requeued


def reap_stale_tasks() -> None:
    """django-q2 每分钟调度的入口。"""
    with task_context("reap_stale_tasks", None):
        stale_after = timedelta(seconds=settings.STALE_TASK_SECONDS)
        cleanups = requeue_stale_cleanups(stale_after=stale_after)
        # 文档有租约：租约过期本身就说明执行者已死，不必再等 RAG_STALE_TASK_SECONDS
        documents = reap_stale_documents(stale_after=timedelta(0))
        documents += requeue_waiting_documents(stale_after=stale_after)
        if cleanups or documents:
            logger.info("stale_tasks_reaped", cleanup_tasks=len(cleanups), documents=len(documents))
        else:
            # 绝大多数分钟什么都没有：只在 debug 级别留一行，免得每分钟刷屏
            logger.debug("stale_tasks_none")
