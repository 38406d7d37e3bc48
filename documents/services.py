"""文档的写操作：上传、删除、重新索引。校验顺序：存在性 → 可用性 → 权限 → 输入。"""

from __future__ import annotations

import errno
import hashlib
import os
import uuid
from pathlib import Path
from typing import IO, Any

import structlog
from django.conf import settings
from django.db import transaction

from documents.ingestion import ingestion_submit
from documents.models import Document
from documents.selectors import document_fetch
from documents.uploads import upload_filename
from infra.context import current_request_id
from infra.errors import ApplicationError, ErrorCode, ErrorDetail
from infra.principal import Principal, authorize_knowledge_base
from knowledge.models import KnowledgeBase
from knowledge.options import chunking_options, options_dict
from knowledge.selectors import knowledge_base_unavailable, usable_knowledge_base
from raglib.parsing import UnsupportedFormatError, detect_format

logger = structlog.get_logger(__name__)


_HEAD_BYTES = 8192


def unsupported_media_type(exc: UnsupportedFormatError) -> ApplicationError:
    """解析层的判定结果原样转成 415：消息里已说明内容像什么，并列出支持的格式。"""
    return ApplicationError(
        ErrorCode.UNSUPPORTED_MEDIA_TYPE, str(exc), 415,
        [ErrorDetail("file", "UNSUPPORTED_MEDIA_TYPE", f"Supported formats: {', '.join(exc.supported)}")],
    )


def writable_knowledge_base(*, principal: Principal, kb_id: str | uuid.UUID) -> KnowledgeBase:
    """上传前的三步校验：存在（404）→ 可用（403 UNAVAILABLE）→ 有写权限（403）。"""
    return usable_knowledge_base(principal=principal, kb_id=kb_id, write=True)


def storage_full() -> ApplicationError:
    return ApplicationError(
        ErrorCode.SERVICE_UNAVAILABLE, "The server has no space left to store the upload; retry later", 503,
        [ErrorDetail("file", "STORAGE_FULL", "The data directory is full (RAG_DATA_DIR)")],
        headers={"Retry-After": "60"},
    )


def _store_upload(upload: IO[bytes], destination: Path) -> tuple[int, str]:
    """把上传文件复制到数据目录，返回 (字节数, sha256)。

    先写到 ``.partial`` 再改名：磁盘写满等写入失败时删掉半截文件，数据目录里不会留下残缺的原始文件。
    """
    partial = destination.with_name(destination.name + ".partial")
    digest = hashlib.sha256()
    size = 0
    upload.seek(0)
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("wb") as out:
            while block := upload.read(1 << 20):
                digest.update(block)
                size += len(block)
                out.write(block)
        os.replace(partial, destination)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            logger.error("upload_storage_full", path=str(destination.parent))
            raise storage_full() from exc
        raise
    return size, digest.hexdigest()


def document_upload(
    *,
    kb: KnowledgeBase,
    filename: str,
    upload: IO[bytes],
    metadata: dict[str, Any],
    chunking: dict[str, Any],
) -> Document:
    """登记上传的文档并入队摄取；格式按扩展名与内容双重判定（改了扩展名的二进制会被识破）。"""
    filename = upload_filename(filename)
    upload.seek(0)
    head = upload.read(_HEAD_BYTES)
    try:
        file_format = detect_format(head, filename)
    except UnsupportedFormatError as exc:
        raise unsupported_media_type(exc) from exc
    options = chunking_options(kb.chunking, chunking)
    document_id = uuid.uuid4()
    relative = Path("files") / str(kb.id) / f"{document_id}{Path(filename).suffix.lower()}"
    absolute = Path(settings.DATA_DIR) / relative
    size, sha256 = _store_upload(upload, absolute)
    try:
        with transaction.atomic():
            # 行锁 + 复查状态：与并发的删除/禁用串行化，已删除的知识库不会再收进文档
            locked = KnowledgeBase.objects.select_for_update().get(pk=kb.pk)
            if not locked.is_enabled:
                raise knowledge_base_unavailable(locked)
            document = Document.objects.create(
                id=document_id, knowledge_base=locked, filename=filename, metadata=metadata,
                format=file_format, size_bytes=size, sha256=sha256, stored_path=str(relative),
                chunking=options_dict(options) if chunking else {}, request_id=current_request_id() or "",
            )
            ingestion_submit(document)
    except BaseException:
        absolute.unlink(missing_ok=True)
        raise
    logger.info("document_uploaded", document_id=str(document.id), knowledge_base_id=str(kb.id),
                filename=filename, format=file_format, size_bytes=size)
    return document


def _document_gone(document: Document) -> ApplicationError:
    return ApplicationError(
        ErrorCode.DOCUMENT_DELETED, f"Document '{document.id}' has been deleted", 410,
        [ErrorDetail("document_id", "DELETED", "The document was deleted")],
    )


@transaction.atomic
def document_delete(*, principal: Principal, document_id: str | uuid.UUID) -> None:
    """删除分块与向量，文档行留作墓碑（status=deleted），原始文件在提交后删除。"""
    document = document_fetch(document_id=document_id, for_update=True)
    if document.status == Document.Status.DELETED:
        raise _document_gone(document)
    if document.knowledge_base.is_deleted:
        raise knowledge_base_unavailable(document.knowledge_base)
    authorize_knowledge_base(principal, document.knowledge_base_id, write=True)
    deleted, _ = document.chunks.all().delete()
    document.status = Document.Status.DELETED
    document.chunk_count = 0
    document.reindex_status = ""
    document.save(update_fields=["status", "chunk_count", "reindex_status", "updated_at"])
    stored = Path(settings.DATA_DIR) / document.stored_path if document.stored_path else None
    if stored is not None:
        transaction.on_commit(lambda: stored.unlink(missing_ok=True))
    logger.info("document_deleted", document_id=str(document.id), chunks_deleted=deleted)


@transaction.atomic
def document_reindex(*, principal: Principal, document_id: str | uuid.UUID, queue: bool = True) -> Document:
    """重新索引：completed 文档保持可检索直到新分块提交；failed 文档等同于重新摄取。

    ``queue=False`` 供 ``manage.py reindex`` 在本进程内同步执行，不再入队。
    """
    document = document_fetch(document_id=document_id, for_update=True)
    if document.status == Document.Status.DELETED:
        raise _document_gone(document)
    if not document.knowledge_base.is_enabled:
        raise knowledge_base_unavailable(document.knowledge_base)
    authorize_knowledge_base(principal, document.knowledge_base_id, write=True)
    busy = document.status == Document.Status.PROCESSING or document.reindex_status in (
        Document.Reindex.QUEUED, Document.Reindex.RUNNING)
    if busy:
        raise ApplicationError(
            ErrorCode.DOCUMENT_BUSY, f"Document '{document.id}' is already being indexed", 409,
            [ErrorDetail("document_id", "BUSY", "Wait for the current indexing to finish")],
        )
    if document.status == Document.Status.FAILED:
        document.status = Document.Status.PROCESSING
        document.error_message = ""
    else:
        document.reindex_status = Document.Reindex.QUEUED
    document.request_id = current_request_id() or document.request_id
    document.save()
    # 人工重新索引开始新的一轮：新的作业，尝试次数与上一轮弄死 worker 的次数都不带过来
    document.job = ingestion_submit(document, push=queue)
    logger.info("document_reindex_requested", document_id=str(document.id))
    return document
