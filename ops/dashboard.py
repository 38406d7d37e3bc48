"""管理后台首页的概览数字（只读）：各知识库的文档与分块、最近 24 小时的失败、摄取队列、进行中的清理任务。

数字都来自记录事实的表（documents、cleanup_tasks、django-q2 的队列表），不读指标：
多进程的 Prometheus 计数在 web 进程里看不全，而这些表是所有进程共享的。
分块数取已完成文档的 chunk_count 之和，而不是对 document_chunks 计数——后者在大库上是全表扫描。
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q, Sum
from django.utils import timezone
from django_q.brokers import get_broker

from documents.models import Document
from knowledge.models import CleanupTask, KnowledgeBase

FAILURE_WINDOW = timedelta(hours=24)
MAX_FAILURES_SHOWN = 10


@dataclass(frozen=True)
class KnowledgeBaseFigures:
    id: str
    name: str
    status: str
    processing: int
    completed: int
    failed: int
    chunks: int


@dataclass(frozen=True)
class RecentFailure:
    kind: str  # "document" | "cleanup"
    object_id: str
    title: str
    knowledge_base: str
    message: str
    at: datetime


@dataclass(frozen=True)
class CleanupProgress:
    id: str
    knowledge_base: str
    status: str
    processed: int
    total: int | None
    percent: float | None


@dataclass(frozen=True)
class Dashboard:
    knowledge_bases: list[KnowledgeBaseFigures]
    failures: list[RecentFailure]
    failures_total: int
    waiting: int  # 已上传、还没有 worker 开始处理
    ingesting: int  # worker 正在处理
    queued_tasks: int  # django-q2 队列里尚未被取走的任务（所有类型）
    cleanups: list[CleanupProgress]


def _knowledge_base_figures() -> list[KnowledgeBaseFigures]:
    status = Document.Status
    rows = (KnowledgeBase.objects.exclude(status=KnowledgeBase.Status.DELETED).order_by("name")
            .annotate(processing=Count("documents", filter=Q(documents__status=status.PROCESSING)),
                      completed=Count("documents", filter=Q(documents__status=status.COMPLETED)),
                      failed=Count("documents", filter=Q(documents__status=status.FAILED)),
                      chunk_total=Sum("documents__chunk_count", filter=Q(documents__status=status.COMPLETED))))
    return [KnowledgeBaseFigures(str(kb.id), kb.name, kb.status, kb.processing, kb.completed, kb.failed,
                                 kb.chunk_total or 0) for kb in rows]


def _recent_failures(since: datetime) -> tuple[list[RecentFailure], int]:
    documents = (Document.objects.filter(updated_at__gte=since)
                 .filter(Q(status=Document.Status.FAILED) | Q(reindex_status=Document.Reindex.FAILED))
                 .select_related("knowledge_base").order_by("-updated_at"))
    cleanups = (CleanupTask.objects.filter(status=CleanupTask.Status.FAILED, updated_at__gte=since)
                .select_related("knowledge_base").order_by("-updated_at"))
    failures = [RecentFailure("document", str(d.id), d.filename, d.knowledge_base.name, d.error_message, d.updated_at)
                for d in documents[:MAX_FAILURES_SHOWN]]
    failures += [RecentFailure("cleanup", str(t.id), "清理任务", t.knowledge_base.name, t.error_message, t.updated_at)
                 for t in cleanups[:MAX_FAILURES_SHOWN]]
    failures.sort(key=lambda failure: failure.at, reverse=True)
    return failures[:MAX_FAILURES_SHOWN], documents.count() + cleanups.count()


def _cleanups_in_progress() -> list[CleanupProgress]:
    tasks = (CleanupTask.objects.filter(status__in=[CleanupTask.Status.PENDING, CleanupTask.Status.RUNNING])
             .select_related("knowledge_base").order_by("created_at"))
    return [CleanupProgress(str(t.id), t.knowledge_base.name, t.status, t.processed, t.total,
                            None if not t.total else round(100 * t.processed / t.total, 1)) for t in tasks]


def dashboard_figures(*, now: datetime | None = None) -> Dashboard:
    """管理后台首页的全部数字（约七次查询，与知识库数量无关）。"""
    now = now or timezone.now()
    failures, failures_total = _recent_failures(now - FAILURE_WINDOW)
    processing = Document.objects.filter(status=Document.Status.PROCESSING).aggregate(
        waiting=Count("id", filter=Q(stage="")), ingesting=Count("id", filter=~Q(stage="")))
    return Dashboard(
        knowledge_bases=_knowledge_base_figures(),
        failures=failures,
        failures_total=failures_total,
        waiting=processing["waiting"],
        ingesting=processing["ingesting"],
        # 问当前的 broker：ORM 队列里 lock 晚于现在的是已被 worker 取走、正在执行的，不算排队；Redis 是列表长度
        queued_tasks=get_broker().queue_size(),
        cleanups=_cleanups_in_progress(),
    )
