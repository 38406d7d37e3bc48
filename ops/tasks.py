"""后台任务入口（django-q2 按名字调用，只接收 id，可重复执行）与周期任务。

- 知识库清理 ``run_cleanup``（执行过程见 ``ops.cleanup``）与知识库 HNSW 索引同步 ``sync_vector_indexes``；
- 暂不进图的分块插进知识库自己的 HNSW 图 ``flush_vector_pending``（写入攒够一批后按知识库入队，另有每分钟的定时
  任务，快队列）；
- 全文引擎的 L0 合并成段 ``compact_fulltext``（写入后按知识库入队，另有每分钟的定时任务）；全文引擎的维护
  ``maintain_fulltext``（维护队列，每 10 分钟一次）：闲下来的知识库并段、小的段表重写紧凑、批量写入之后把 L0 的
  表与索引缩回去；
- 回收器 ``reap_stale_tasks``：每分钟一次（在快队列上执行，不排在长摄取后面），把 worker 死掉（租约过期未续）的
  作业放回它自己的队列、死过两次的判为失败，把交给队列后超过 RAG_STALE_TASK_SECONDS 还没人开始的作业再交一次
  （见 ``jobs.runner.reap``）。停止服务不在此列：收到停止信号的 worker 在检查点交还租约、作业原样回到队列
  （GRACEFUL-STOP-NOT-A-DEATH），这里看到的过期租约只来自真的死掉的 worker。
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import structlog
from django.apps import apps as global_apps
from django.apps.registry import Apps
from django.conf import settings

from infra.context import task_context
from infra.workers import stops_at_checkpoints
from jobs.runner import reap, run_job
from search import segments
from search.ann import flush_pending, kb_indexes_sync
from search.relevance import relevance_refresh

logger = structlog.get_logger(__name__)

REAPER_SCHEDULE_NAME = "ops.reap_stale_tasks"

# 索引同步的定时调度（迁移 knowledge.0005 建立，每 5 分钟一次）
VECTOR_INDEX_SCHEDULE = "knowledge.sync_vector_indexes"
VECTOR_INDEX_TASK_FUNC = "ops.tasks.sync_vector_indexes"
# 相关概率模型的定时检查（迁移 ops.0005 建立，ops.0008 改为每分钟一次；重新拟合仍至少隔 10 分钟，见 search.relevance）
RELEVANCE_SCHEDULE = "search.refresh_relevance_profiles"
RELEVANCE_TASK_FUNC = "ops.tasks.refresh_relevance_profiles"
# 暂不进图的分块的定时插图（迁移 ops.0009 建立，每分钟一次，快队列）
VECTOR_FLUSH_SCHEDULE = "search.flush_vector_pending"
# 全文 L0 的定时合并（迁移 ops.0006 建立，每分钟一次，快队列）
FULLTEXT_COMPACT_SCHEDULE = "search.compact_fulltext"
# 全文引擎的定时维护：闲时并段、小的段表重写、L0 收缩（迁移 ops.0007 建立，每 10 分钟一次，维护队列：
# 并一个 10 万块的库要十几秒到一两分钟，REINDEX CONCURRENTLY 要等之前的事务结束）
FULLTEXT_MAINTENANCE_SCHEDULE = "search.maintain_fulltext"
FULLTEXT_MAINTENANCE_TASK_FUNC = "ops.tasks.maintain_fulltext"
# 按维护任务上限（RAG_MAINTENANCE_TIMEOUT）计时的调度：名字 → 任务函数
MAINTENANCE_SCHEDULES = {VECTOR_INDEX_SCHEDULE: VECTOR_INDEX_TASK_FUNC, RELEVANCE_SCHEDULE: RELEVANCE_TASK_FUNC,
                         FULLTEXT_MAINTENANCE_SCHEDULE: FULLTEXT_MAINTENANCE_TASK_FUNC}


@stops_at_checkpoints
def run_cleanup(job_id: str, request_id: str | None = None, **_legacy: Any) -> None:
    """清理一个已删除知识库的文档、分块与向量的作业（``ops.cleanup``）；worker 停止时在批与批之间放下。

    ``_legacy``：升级前入队的消息（参数是清理任务 id 与 attempt）：不是作业 id，``run_job`` 找不到就跳过；
    那些清理任务的作业由迁移 knowledge.0006 建好，回收器把它们交给队列。
    """
    with task_context("cleanup", request_id, job_id=job_id):
        run_job(job_id)


def sync_vector_indexes() -> None:
    """按分块数为大知识库建或删自己的 HNSW 索引（``search.ann``）；定时执行，幂等。"""
    with task_context("ann_index_sync", None):
        kb_indexes_sync()


def flush_vector_pending(kb_id: str | None = None, request_id: str | None = None) -> None:
    """把暂不进图的分块插进知识库自己的 HNSW 图（``search.ann.flush_pending``）：写入攒够一批后按知识库入队，定时任务
    每分钟处理所有知识库的。幂等，可与写入、别的 flush 同时跑。"""
    with task_context("ann_pending_flush", request_id, kb_id=kb_id):
        flush_pending(kb_id=uuid.UUID(kb_id) if kb_id else None)


def refresh_relevance_profiles(kb_id: str | None = None, request_id: str | None = None) -> None:
    """为新的或变化较大的知识库（重新）拟合相关概率模型（``search.relevance``），幂等：定时任务看所有知识库；
    写入让一个库的分块刚够某种方式拟合时按知识库入队（``documents.ingestion.copy_chunks``），只看这一个。"""
    with task_context("relevance_refresh", request_id, kb_id=kb_id):
        fitted = relevance_refresh(only=uuid.UUID(kb_id) if kb_id else None)
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


def maintain_fulltext() -> None:
    """全文引擎的定时维护，幂等：闲下来的知识库把批量写入留下的几个段并成大段（``search.segments.merge_idle``，
    ``RAG_FULLTEXT_IDLE_MERGE_MINUTES`` 为 0 时不并），并过之后把段的表重写紧凑（``repack_tables``）；
    引擎各表的索引远大于按现有的行估出的大小时重建回去（``shrink_indexes``，别的进程正在重建时跳过）。"""
    with task_context("fulltext_maintenance", None):
        merged = False
        if settings.FULLTEXT_IDLE_MERGE_MINUTES:
            for kb_id in segments.idle_due(settings.FULLTEXT_IDLE_MERGE_MINUTES):
                result = segments.merge_idle(kb_id)
                if result.merged:
                    merged = True
                    logger.info("fulltext_idle_merged", kb_id=str(kb_id), merged=result.merged,
                                segments=result.segments, purged=result.purged)
        repacked = segments.repack_tables() if merged else []
        if repacked:
            logger.info("fulltext_tables_repacked", tables=repacked)
        shrunk = segments.shrink_indexes()
        if shrunk:
            logger.info("fulltext_indexes_shrunk", bytes_before=shrunk[0], bytes_after=shrunk[1])


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


def reap_stale_tasks() -> None:
    """django-q2 每分钟调度的入口：回收 worker 死掉的作业、再交一次久久没人开始的作业（``jobs.runner.reap``）。"""
    with task_context("reap_stale_tasks", None):
        handled = reap(stale_after=timedelta(seconds=settings.STALE_TASK_SECONDS))
        if handled:
            logger.info("stale_tasks_reaped", jobs=len(handled))
        else:
            # 绝大多数分钟什么都没有：只在 debug 级别留一行，免得每分钟刷屏
            logger.debug("stale_tasks_none")
