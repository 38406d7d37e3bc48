"""django-q2 任务入口：只接收 id，可重复执行。"""

from __future__ import annotations

import uuid
from typing import Any

from django.apps import apps as global_apps
from django.apps.registry import Apps
from django.conf import settings

from knowledge.cleanup import cleanup_run
from ops.context import task_context
from ops.retry import database_ready
from search.ann import kb_indexes_sync

# 索引同步的定时调度（迁移 knowledge.0005 建立，每 5 分钟一次）
VECTOR_INDEX_SCHEDULE = "knowledge.sync_vector_indexes"


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


def vector_index_schedule_refresh(*, using: str, apps: Apps = global_apps, **_: Any) -> None:
    """让索引同步的调度按 ``RAG_MAINTENANCE_TIMEOUT`` 计时（post_migrate 信号，见 ``knowledge.apps``）。

    百万分块的库建一次图要 40 分钟以上，按集群默认的 ``RAG_TASK_TIMEOUT`` 计时会在建完之前被杀、下一轮重来。
    调度行由迁移建立，迁移只跑一次，而超时是部署时的环境变量：所以每次 migrate（``serve`` 每次启动都跑）
    把当前值写进调度的 ``q_options``，django-q2 调度器入队时取出作为这个任务的 timeout。只更新、不新建：
    调度被人删掉就是不要它。``flush`` 也发这个信号，但不带 ``apps``：那时用当前的模型。
    """
    try:
        schedule = apps.get_model("django_q", "Schedule")
    except LookupError:
        return  # django_q 的表还没建（或已退回零）
    schedule.objects.using(using).filter(name=VECTOR_INDEX_SCHEDULE).update(
        kwargs=repr({"q_options": {"timeout": settings.MAINTENANCE_TIMEOUT}}))
