"""周期任务：回收孤儿任务。

worker 被 SIGKILL、机器重启、入队前进程崩溃，都可能留下“状态是 pending/running、却没有人在做”
的任务行。这里每分钟扫描一次：超过 RAG_STALE_TASK_SECONDS 无进展、且没有执行者持有其
advisory lock 的任务，重新入队（任务本身幂等，重复入队无害）。
"""

from __future__ import annotations

from datetime import timedelta

import structlog
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from documents.models import Document
from knowledge.cleanup import lock_key
from knowledge.models import CleanupTask
from ops import metrics
from ops.context import task_context
from ops.locks import is_locked

logger = structlog.get_logger(__name__)

REAPER_SCHEDULE_NAME = "ops.reap_stale_tasks"


def requeue_stale_cleanups(*, stale_after: timedelta) -> list[str]:
    """重新入队无人执行的清理任务，返回其 id 列表。"""
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
        if is_locked(lock_key(task.id)):
            continue
        # 先刷新 updated_at：队列积压时不至于每分钟重复入队
        CleanupTask.objects.filter(pk=task.pk).update(updated_at=timezone.now())
        async_task("knowledge.tasks.run_cleanup", str(task.id), attempt=max(task.attempts, 1),
                   request_id=task.request_id or None)
        metrics.STALE_TASKS_REQUEUED.labels(kind="cleanup").inc()
        logger.warning("stale_task_requeued", kind="cleanup", cleanup_task_id=str(task.id), status=task.status)
        requeued.append(str(task.id))
    return requeued


def reap_stale_documents(*, stale_after: timedelta) -> list[str]:
    """处理中途 worker 死掉的文档：重新入队（计为一次新尝试），尝试用尽则置为失败。

    只看“已经开始过”（stage 非空）的文档：排队等待 worker 的文档同样无人持锁，但它们没有死。
    """
    from django_q.tasks import async_task

    cutoff = timezone.now() - stale_after
    candidates = Document.objects.filter(updated_at__lt=cutoff).exclude(stage="").filter(
        Q(status=Document.Status.PROCESSING) | Q(reindex_status=Document.Reindex.RUNNING)
    )
    handled = []
    for document in candidates:
        if is_locked(f"ingest:{document.id}"):
            continue
        attempt = document.attempts + 1
        metrics.STALE_TASKS_REQUEUED.labels(kind="ingestion").inc()
        if attempt > settings.INGEST_MAX_RETRIES + 1:
            message = (f"The worker processing this document stopped unexpectedly during "
                       f"'{document.stage}' ({document.attempts} attempts); giving up")
            if document.status == Document.Status.PROCESSING:
                Document.objects.filter(pk=document.pk).update(
                    status=Document.Status.FAILED, error_message=message, stage="", updated_at=timezone.now())
            else:
                Document.objects.filter(pk=document.pk).update(
                    reindex_status=Document.Reindex.FAILED, stage="", updated_at=timezone.now(),
                    error_message=f"Re-indexing failed; the previous chunks are still served. {message}")
            metrics.DOCUMENT_INGESTION.labels(status="failed").inc()
            logger.error("stale_document_failed", document_id=str(document.id), stage=document.stage)
        else:
            Document.objects.filter(pk=document.pk).update(stage="", updated_at=timezone.now())
            async_task("documents.tasks.run_ingestion", str(document.id), attempt=attempt,
                       request_id=document.request_id or None)
            logger.warning("stale_document_requeued", document_id=str(document.id), attempt=attempt)
        handled.append(str(document.id))
    return handled


def reap_stale_tasks() -> None:
    """django-q2 每分钟调度的入口。"""
    with task_context("reap_stale_tasks", None):
        stale_after = timedelta(seconds=settings.STALE_TASK_SECONDS)
        cleanups = requeue_stale_cleanups(stale_after=stale_after)
        documents = reap_stale_documents(stale_after=stale_after)
        if cleanups or documents:
            logger.info("stale_tasks_reaped", cleanup_tasks=len(cleanups), documents=len(documents))
        else:
            # 绝大多数分钟什么都没有：只在 debug 级别留一行，免得每分钟刷屏
            logger.debug("stale_tasks_none")
