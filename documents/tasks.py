"""django-q2 任务入口：只接收作业 id，可重复执行（作业的执行见 ``jobs.runner``）。"""

from __future__ import annotations

from typing import Any

from infra.context import task_context
from infra.workers import stops_at_checkpoints
from jobs.runner import run_job


@stops_at_checkpoints
def run_ingestion(job_id: str, request_id: str | None = None, **_legacy: Any) -> None:
    """摄取（或重新索引）一个文档的作业。worker 停止时在检查点交还工作、原样放回队列（GRACEFUL-STOP-NOT-A-DEATH）。

    ``_legacy``：升级前入队的消息（参数是文档 id 与 attempt）。文档 id 不是作业 id，``run_job`` 找不到就跳过；
    那些文档的作业由迁移 documents.0010 建好，回收器把它们交给队列。
    """
    with task_context("ingest", request_id, job_id=job_id):
        run_job(job_id)
