"""django-q2 任务入口：只接收 id，可重复执行。"""

from __future__ import annotations

import uuid

from documents.ingestion import ingest_document
from infra.context import task_context
from infra.retry import database_ready
from infra.workers import stops_at_checkpoints


@stops_at_checkpoints
def run_ingestion(document_id: str, attempt: int = 1, request_id: str | None = None) -> None:
    """摄取（或重新索引）一个文档。worker 停止时在检查点交还工作、原样重新入队（GRACEFUL-STOP-NOT-A-DEATH）。"""
    with task_context("ingest", request_id, document_id=document_id, attempt=attempt):
        # 数据库重启过的话，worker 手里的连接已经死了：先换一条能用的
        database_ready()
        ingest_document(document_id=uuid.UUID(document_id), attempt=attempt)
