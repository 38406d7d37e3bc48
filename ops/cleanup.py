"""知识库级联清理的执行过程（由 ops.tasks.run_cleanup 调用）。

设计要点：
- 幂等、可续跑：每批删除与 processed 的累加在同一个事务里提交，worker 在任何时刻被杀，
  已提交的批次与计数一致，未提交的批次整体回滚，续跑时从剩余行继续，不会重复计数。
- 清理是一种后台作业（``jobs``，种类 ``cleanup``）：单执行者靠作业的租约（重投递、重试、回收都不会让同一个
  知识库的清理并发执行，数据库重启也不会），worker 死了由回收器放回快队列，优雅停止在批与批之间放下。
- 超时：清理 1M 分块的库约一小时，按 ``RAG_MAINTENANCE_TIMEOUT`` 而不是 ``RAG_TASK_TIMEOUT`` 计时；
  超过 ORM 代理 ``retry`` 的那份重投递看到作业已在运行，立即返回。
- 自动重试：失败后按 base·2^(n-1)（默认 1/2/4 分钟）退避重试（作业执行器安排）；用尽重试次数后置为 failed，
  等待人工重试。
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
from jobs.models import Job
from jobs.runner import (
    Failure,
    JobCancelled,
    JobFailed,
    JobKind,
    JobRun,
    LeaseLost,
    WorkerStopping,
    attempt_words,
)
from knowledge.models import CleanupTask
from knowledge.services import CLEANUP_KIND, CLEANUP_TASK_FUNC
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


def _execute(task: CleanupTask, job: JobRun) -> None:
    kb_id = task.knowledge_base_id
    if task.total is None:
        task.total = _remaining(kb_id)
        CleanupTask.objects.filter(pk=task.pk).update(total=task.total, updated_at=timezone.now())
        logger.info("cleanup_counted", total=task.total)
    # 先整段删掉全文的段与统计行：之后删分块时触发器跳过这个知识库，不再逐个查找它的全文数据
    segments.drop(kb_id)
    pause = settings.CLEANUP_BATCH_PAUSE_MS / 1000
    while True:
        # 检查点：每批都是一个事务、可续跑，worker 要停就在批与批之间放下（作业原样回到队列，不算 worker 死亡）
        job.checkpoint()
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
    # 知识库的文档都删了，它们的作业记录也不再有人看；本清理作业自己留着（它还没结束）。还在队列里的摄取作业
    # 一并删掉：它的消息到了 worker 那里找不到作业，直接跳过
    Job.objects.filter(knowledge_base_id=kb_id).exclude(pk=job.job.pk).delete()
    with transaction.atomic():
        task = CleanupTask.objects.select_for_update().get(pk=task.pk)
        if task.total != task.processed:
            # 统计之后又有行写入（或被其他途径删除）：以实际清理数为准，保证 completed 时二者相等
            logger.warning("cleanup_total_adjusted", counted=task.total, processed=task.processed)
        task.total = task.processed
        task.status = CleanupTask.Status.COMPLETED
        task.error_message = ""
        task.finished_at = timezone.now()
        task.save()
    metrics.CLEANUP_TASKS.labels(status="completed").inc()
    logger.info("cleanup_completed", processed=task.processed)


def execute(job: JobRun) -> None:
    """清理作业的一次尝试（``jobs.runner`` 调用；同一知识库的清理同一时刻只有持有作业租约的一个执行者）。
    任何失败都按暂时性处理、退避重试：删除是幂等的，文件删不掉多半是一时的（权限、挂载），用尽次数才失败。"""
    task = CleanupTask.objects.filter(pk=job.job.target_id).first()
    if task is None:
        raise JobCancelled()
    if task.status in (CleanupTask.Status.COMPLETED, CleanupTask.Status.FAILED):
        logger.info("cleanup_skipped_finished", status=task.status)
        return
    task.status = CleanupTask.Status.RUNNING
    task.started_at = task.started_at or timezone.now()
    task.save(update_fields=["status", "started_at", "updated_at"])
    logger.info("cleanup_started", knowledge_base_id=str(task.knowledge_base_id))
    try:
        _execute(task, job)
    except (WorkerStopping, LeaseLost):
        raise
    except Exception as exc:
        # 驱动报错原文（主机、socket 路径）不进 error_message，它会出现在 API 响应里；原文见日志
        reason = "the database connection was lost" if is_database_unavailable(exc) else str(exc)
        logger.warning("cleanup_attempt_failed", exc_info=exc)
        raise JobFailed(f"Deleting the knowledge base's documents, chunks and files failed: {reason}",
                        transient=True) from exc


def record_failure(job: Job, failure: Failure, retry_in: int | None) -> None:
    """失败写在清理任务上；不再重试时置为 failed，等待人工重试。"""
    words = (f"The worker deleting this knowledge base stopped unexpectedly {failure.deaths} times"
             if failure.deaths else failure.message) + attempt_words(job, failure, retry_in)
    fields: dict[str, object] = {"error_message": words[:4000], "updated_at": timezone.now()}
    if retry_in is None:
        fields.update(status=CleanupTask.Status.FAILED, finished_at=timezone.now())
        metrics.CLEANUP_TASKS.labels(status="failed").inc()
        logger.error("cleanup_failed", error=words, attempts=job.attempt)
    CleanupTask.objects.filter(pk=job.target_id).exclude(status=CleanupTask.Status.COMPLETED).update(**fields)


# 由 AppConfig.ready 登记到作业执行器（jobs.runner.register）
CLEANUP_JOB = JobKind(
    name=CLEANUP_KIND, func=CLEANUP_TASK_FUNC, execute=execute, record_failure=record_failure,
    max_retries=lambda: settings.CLEANUP_MAX_RETRIES, retry_base_seconds=lambda: settings.CLEANUP_RETRY_BASE_SECONDS,
    # 清理 1M 分块的库约一小时：按维护任务的上限计时，而不是 RAG_TASK_TIMEOUT
    timeout=lambda: settings.MAINTENANCE_TIMEOUT,
)
