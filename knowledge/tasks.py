"""django-q2 任务入口：只接收 id，可重复执行。"""

from __future__ import annotations

import uuid

from knowledge.cleanup import cleanup_run
from ops.context import task_context
from ops.retry import database_ready
from search.ann import kb_indexes_sync


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
