"""知识库级联清理的执行过程（由 ops.tasks.run_cleanup 调用）。

设计要点：
- 幂等、可续跑：每批删除与 processed 的累加在同一个事务里提交，worker 在任何时刻被杀，
  已提交的批次与计数一致，未提交的批次整体回滚，续跑时从剩余行继续，不会重复计数。
- 单执行者：以知识库 id 为键的 advisory lock，保证重投递/重试/回收不会让同一个知识库的清理并发执行
  （一个知识库只会有一条清理任务，锁仍按知识库取：互斥的是对同一批行的删除，不依赖这个一对一）。
- 超时：清理 1M 分块的库约一小时，按 ``RAG_MAINTENANCE_TIMEOUT`` 而不是 ``RAG_TASK_TIMEOUT`` 计时
  （:func:`cleanup_q_options`）；超过 ORM 代理 ``retry`` 的那份重投递拿不到锁，立即返回。
- 自动重试：失败后按 base·2^(n-1)（默认 1/2/4 分钟）用 django-q2 的一次性 Schedule
  安排下一次尝试；用尽重试次数后置为 failed，等待人工重试。
- 原始文件：行删完后删除 ``RAG_DATA_DIR/files/<kb>``；删不掉就是一次失败（照常重试），文件还在时绝不报告完成。
  这个目录是符号链接时只删链接目标里本服务写下的文件，不跟着链接整棵删除（见 :func:`files_remove`）。
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from documents.models import Document
from documents.storage import knowledge_base_files_dir, owned_file_document
from infra import metrics
from infra.errors import is_database_unavailable
from infra.locks import advisory_lock
from infra.retry import backoff_seconds, database_ready, schedule_task
from knowledge.models import CleanupTask
from knowledge.services import CLEANUP_TASK_FUNC, cleanup_q_options
from search import segments

logger = structlog.get_logger(__name__)

_DELETE_CHUNKS_SQL = """
    DELETE FROM document_chunks
    WHERE id IN (SELECT id FROM document_chunks WHERE knowledge_base_id = %s LIMIT %s)
"""
# 文档与其残余分块在同一条语句中删除：即使有分块在分块阶段之后才写入，也不会留下孤儿或违反外键
_DELETE_DOCUMENTS_SQL = """
    WITH doomed AS (SELECT id FROM documents WHERE knowledge_base_id = %s LIMIT %s),
         chunks AS (DELETE FROM document_chunks WHERE document_id IN (SELECT id FROM doomed) RETURNING 1),
         docs AS (DELETE FROM documents WHERE id IN (SELECT id FROM doomed) RETURNING 1)
    SELECT (SELECT count(*) FROM chunks) + (SELECT count(*) FROM docs)
"""


def lock_key(kb_id: uuid.UUID) -> str:
    """清理一个知识库的 advisory lock 键（``infra.locks``）；回收器用同一个键判断有没有活着的执行者。"""
    return f"cleanup:{kb_id}"


def _remaining(kb_id: uuid.UUID) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM document_chunks WHERE knowledge_base_id = %s)"
            " + (SELECT count(*) FROM documents WHERE knowledge_base_id = %s)",
            [kb_id, kb_id],
        )
        return int(cursor.fetchone()[0])


def delete_batch(kb_id: uuid.UUID, batch_size: int) -> int:
    """删除一批分块（分块删完后删文档），返回删除的行数；0 表示已清空。"""
    with connection.cursor() as cursor:
        cursor.execute(_DELETE_CHUNKS_SQL, [kb_id, batch_size])
        if cursor.rowcount:
            return int(cursor.rowcount)
        cursor.execute(_DELETE_DOCUMENTS_SQL, [kb_id, batch_size])
        return int(cursor.fetchone()[0])


class FilesRemain(Exception):
    """知识库的原始文件没能删掉；消息只给相对数据目录的路径（它会出现在 API 响应里）。"""


def _remove_through_link(link: Path) -> None:
    """知识库目录是符号链接：只删目标目录第一层里本服务写下、且不属于任何现存文档的文件，再删链接本身。

    不对目标做 rmtree：链接可能指向数据目录以外的任意位置（运维把大知识库挪到了别的盘，也可能是误操作），
    甚至指向另一个知识库的目录。能证明属于本知识库的只有按 ``owned_file_document`` 命名、而对应文档行已不存在的文件
    （本知识库的文档行此时已全部删除，名字对得上现存文档的文件属于别的知识库）。子目录、其他文件原样留下，
    记一条日志。删除用 unlink：目标目录里的条目本身是链接时只删链接，不跟随。
    指向 ``files/`` 本身或其下别的知识库目录时一个文件都不删：那里正在上传、还没提交文档行的文件也对不上现存文档。
    """
    target = Path(os.path.realpath(link))
    files_root = Path(os.path.realpath(link.parent))
    if not target.is_dir() or target == files_root or files_root in target.parents:
        # 悬空的链接、指向文件、指向别的知识库的目录：链接本身就是这个知识库在数据目录里留下的全部
        if target.is_dir():
            logger.warning("cleanup_link_into_files_kept", target=str(target))
        link.unlink()
        return
    owned: dict[str, uuid.UUID] = {}
    kept: list[str] = []
    with os.scandir(target) as entries:
        for entry in entries:
            document_id = owned_file_document(entry.name)
            if document_id is None or entry.is_dir(follow_symlinks=False):
                kept.append(entry.name)
            else:
                owned[entry.name] = document_id
    live = set(Document.objects.filter(pk__in=set(owned.values())).values_list("pk", flat=True))
    removed = 0
    for name, document_id in owned.items():
        if document_id in live:
            kept.append(name)
            continue
        (target / name).unlink(missing_ok=True)
        removed += 1
    link.unlink()
    logger.info("cleanup_files_removed_through_link", target=str(target), removed=removed, kept=len(kept))
    if kept:
        logger.warning("cleanup_link_target_kept", target=str(target), kept=len(kept), examples=sorted(kept)[:5])


def files_remove(kb_id: uuid.UUID) -> None:
    """删除知识库的原始文件目录；删不掉抛 ``FilesRemain``（任务按失败重试），删完核对目录确实不在了。

    普通目录用 rmtree（它不跟随目录里的符号链接，只删链接本身）；目录本身是符号链接时见 ``_remove_through_link``。
    """
    folder = knowledge_base_files_dir(kb_id)
    relative = f"files/{kb_id}"
    try:
        if folder.is_symlink():
            _remove_through_link(folder)
        elif folder.is_dir():
            shutil.rmtree(folder)
        elif folder.exists():
            folder.unlink()
    except OSError as exc:
        raise FilesRemain(f"the files under {relative} in RAG_DATA_DIR could not be deleted "
                          f"({exc.strerror or type(exc).__name__})") from exc
    if os.path.lexists(folder):
        raise FilesRemain(f"{relative} in RAG_DATA_DIR still exists after deleting it")


def _execute(task: CleanupTask) -> None:
    kb_id = task.knowledge_base_id
    if task.total is None:
        task.total = _remaining(kb_id)
        CleanupTask.objects.filter(pk=task.pk).update(total=task.total, updated_at=timezone.now())
        logger.info("cleanup_counted", total=task.total)
    # 先整段删掉全文的段与统计行：之后删分块时触发器跳过这个知识库，不再逐个查找它的全文数据
    segments.drop(kb_id)
    pause = settings.CLEANUP_BATCH_PAUSE_MS / 1000
    while True:
        with transaction.atomic():
            deleted = delete_batch(kb_id, settings.CLEANUP_BATCH_SIZE)
            if deleted:
                CleanupTask.objects.filter(pk=task.pk).update(
                    processed=F("processed") + deleted, updated_at=timezone.now()
                )
        if not deleted:
            break
        logger.debug("cleanup_batch", deleted=deleted)
        if pause:
            time.sleep(pause)
    # 清理期间才提交的摄取会重新建起统计行（它的分块已在上面删掉）：再清一次，不留下计数为 0 的统计
    segments.drop(kb_id)
    files_remove(kb_id)
    with transaction.atomic():
        task = CleanupTask.objects.select_for_update().get(pk=task.pk)
        if task.total != task.processed:
            # 统计之后又有行写入（或被其他途径删除）：以实际清理数为准，保证 completed 时二者相等
            logger.warning("cleanup_total_adjusted", counted=task.total, processed=task.processed)
        task.total = task.processed
        task.status = CleanupTask.Status.COMPLETED
        task.error_message = ""
        task.next_retry_at = None
        task.finished_at = timezone.now()
        task.save()
    metrics.CLEANUP_TASKS.labels(status="completed").inc()
    logger.info("cleanup_completed", processed=task.processed)


def _handle_failure(task_id: uuid.UUID, attempt: int, exc: Exception) -> None:
    """记录失败；还有重试额度则安排下一次，否则置为 failed。"""
    # 驱动报错原文（主机、socket 路径）不进 error_message，它会出现在 API 响应里；原文见日志
    reason = "the database connection was lost" if is_database_unavailable(exc) else str(exc)
    message = f"Attempt {attempt} failed while deleting the knowledge base's documents, chunks and files: {reason}"
    # 失败多半发生在数据库断开之后：手里的连接已经死了，先换一条能用的再记录
    database_ready()
    with transaction.atomic():
        task = CleanupTask.objects.select_for_update().get(pk=task_id)
        task.error_message = message[:4000]
        if attempt <= settings.CLEANUP_MAX_RETRIES:
            delay = backoff_seconds(settings.CLEANUP_RETRY_BASE_SECONDS, attempt)
            options = cleanup_q_options()
            task.next_retry_at = schedule_task(
                CLEANUP_TASK_FUNC, str(task_id), attempt=attempt + 1, delay_seconds=delay,
                request_id=task.request_id, label="cleanup-retry", queue=options["cluster"],
                timeout=options["timeout"],
            )
            task.save(update_fields=["error_message", "next_retry_at", "updated_at"])
            metrics.CLEANUP_RETRIES.inc()
            logger.warning("cleanup_retry_scheduled", exc_info=exc, next_attempt=attempt + 1, delay_s=delay)
            return
        task.status = CleanupTask.Status.FAILED
        task.next_retry_at = None
        task.finished_at = timezone.now()
        task.save(update_fields=["status", "error_message", "next_retry_at", "finished_at", "updated_at"])
    metrics.CLEANUP_TASKS.labels(status="failed").inc()
    logger.error("cleanup_failed", exc_info=exc, attempts=attempt)


def cleanup_run(*, task_id: uuid.UUID, attempt: int) -> None:
    """执行（或续跑）一次清理尝试。重复投递、过期的尝试、同一知识库上已有执行者时都会被安全地忽略。"""
    kb_id = CleanupTask.objects.filter(pk=task_id).values_list("knowledge_base_id", flat=True).first()
    if kb_id is None:
        logger.info("cleanup_skipped_finished", status=None)
        return
    with advisory_lock(lock_key(kb_id)) as acquired:
        if not acquired:
            logger.info("cleanup_skipped_busy", knowledge_base_id=str(kb_id))
            return
        # 拿到锁之后再读状态：读知识库 id 与拿锁之间，前一个执行者可能刚把它做完
        task = CleanupTask.objects.filter(pk=task_id).first()
        if task is None or task.status in (CleanupTask.Status.COMPLETED, CleanupTask.Status.FAILED):
            logger.info("cleanup_skipped_finished", status=getattr(task, "status", None))
            return
        if attempt < task.attempts:
            # 旧尝试的重投递：已有更新的尝试接手
            logger.info("cleanup_skipped_stale_attempt", current_attempt=task.attempts)
            return
        task.status = CleanupTask.Status.RUNNING
        task.attempts = attempt
        task.next_retry_at = None
        task.started_at = task.started_at or timezone.now()
        task.save(update_fields=["status", "attempts", "next_retry_at", "started_at", "updated_at"])
        logger.info("cleanup_started", knowledge_base_id=str(task.knowledge_base_id))
        try:
            _execute(task)
        except Exception as exc:
            _handle_failure(task_id, attempt, exc)
