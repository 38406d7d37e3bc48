"""知识库的写操作。每个函数一个事务，校验顺序：存在性 → 可用性 → 权限。"""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from infra.context import current_request_id
from infra.embedders import ModelUnavailableError, default_model, embedding_dimension
from infra.errors import ApplicationError, ErrorCode, ErrorDetail
from infra.principal import Principal, authorize_global_write, authorize_knowledge_base
from jobs.models import Job
from jobs.runner import submit
from knowledge.models import SUPPORTED_DIMENSIONS, CleanupTask, KnowledgeBase
from knowledge.options import ITEM_CHUNKING_DEFAULTS, chunking_options, options_dict
from knowledge.selectors import cleanup_task_not_found, knowledge_base_fetch, parse_uuid

logger = structlog.get_logger(__name__)

_NAME_CONSTRAINT = "knowledge_bases_name_uniq_active"

# 清理由任务层执行（``ops.cleanup`` 登记这种作业，它要删各应用的行）；这里只按种类名登记作业，不导入上层
CLEANUP_KIND = "cleanup"
CLEANUP_TASK_FUNC = "ops.tasks.run_cleanup"


def cleanup_submit(task: CleanupTask) -> Job:
    """为清理任务登记作业：走快队列（不排在长摄取后面）；须在锁住知识库的事务里调用。"""
    return submit(CLEANUP_KIND, task.pk, queue=settings.FAST_QUEUE, knowledge_base_id=task.knowledge_base_id)


def _name_conflict(name: str) -> ApplicationError:
    return ApplicationError(
        ErrorCode.KNOWLEDGE_BASE_NAME_CONFLICT,
        f"Knowledge base name '{name}' is already in use",
        409,
        [ErrorDetail("name", "CONFLICT", "Name must be unique among knowledge bases that are not deleted")],
    )


def _knowledge_base_deleted(kb: KnowledgeBase) -> ApplicationError:
    task = kb.cleanup_tasks.order_by("-created_at").first()
    detail = f"Deleted at {kb.deleted_at.isoformat() if kb.deleted_at else 'unknown time'}"
    if task is not None:
        detail += f"; cleanup task {task.id} is {task.status}"
    return ApplicationError(
        ErrorCode.KNOWLEDGE_BASE_DELETED,
        f"Knowledge base '{kb.id}' has been deleted and can no longer be modified",
        409,
        [ErrorDetail("knowledge_base_id", "DELETED", detail)],
    )


def _save_unique_name(kb: KnowledgeBase, **save_kwargs: Any) -> None:
    """保存并把部分唯一索引冲突翻译成 409；并发创建同名时也由数据库兜底。"""
    try:
        with transaction.atomic():
            kb.save(**save_kwargs)
    except IntegrityError as exc:
        if _NAME_CONSTRAINT in str(exc):
            raise _name_conflict(kb.name) from exc
        raise


def _model_unavailable() -> ApplicationError:
    """模型不可用的 400：消息固定，不带服务器路径或底层异常文本（免得被用来探测文件系统）。"""
    return ApplicationError(
        ErrorCode.VALIDATION_ERROR, "Embedding model is not available", 400,
        [ErrorDetail("embedding.model", "UNAVAILABLE",
                     "The requested embedding model is not available on this server")],
    )


def _resolve_embedding(provider: str | None, model: str | None) -> tuple[str, str, int]:
    """确定知识库的 embedding 模型与维度；模型不可用或维度没有对应索引时是调用方的输入错误。"""
    provider = provider or settings.EMBEDDING_PROVIDER
    model = model or default_model(provider)
    try:
        dimension = embedding_dimension(provider, model)
    except ModelUnavailableError as exc:
        logger.info("embedding_model_rejected", provider=provider, model=model, reason=str(exc))
        raise _model_unavailable() from exc
    except Exception as exc:
        logger.warning("embedding_model_unavailable", provider=provider, model=model, exc_info=exc)
        raise _model_unavailable() from exc
    if dimension not in SUPPORTED_DIMENSIONS:
        raise ApplicationError(
            ErrorCode.VALIDATION_ERROR, "Unsupported embedding dimension", 400,
            [ErrorDetail("embedding.model", "UNSUPPORTED_DIMENSION",
                         f"The model produces {dimension}-d vectors; supported: {SUPPORTED_DIMENSIONS}")],
        )
    return provider, model, dimension


@transaction.atomic
def knowledge_base_create(
    *,
    principal: Principal,
    name: str,
    description: str = "",
    embedding: dict[str, str] | None = None,
    chunking: dict[str, Any] | None = None,
    item_chunking: dict[str, Any] | None = None,
    vector_compression: str = KnowledgeBase.VectorCompression.HALFVEC,
) -> KnowledgeBase:
    """创建知识库，默认 enabled；embedding 模型与维度在此确定且此后不变。"""
    authorize_global_write(principal)
    embedding = embedding or {}
    provider, model, dimension = _resolve_embedding(embedding.get("provider"), embedding.get("model"))
    kb = KnowledgeBase(
        name=name, description=description, embedding_provider=provider, embedding_model=model,
        embedding_dimension=dimension, chunking=options_dict(chunking_options(chunking or {})),
        item_chunking=options_dict(chunking_options(ITEM_CHUNKING_DEFAULTS, item_chunking or {},
                                                    field_name="item_chunking")),
        vector_compression=vector_compression,
    )
    _save_unique_name(kb, force_insert=True)
    logger.info("knowledge_base_created", knowledge_base_id=str(kb.id), name=name)
    return kb


@transaction.atomic
def knowledge_base_update(
    *, principal: Principal, kb_id: str | uuid.UUID, changes: dict[str, Any]
) -> KnowledgeBase:
    """修改 name / description / status（enabled|disabled）/ vector_compression。已删除的知识库一律 409。"""
    kb = knowledge_base_fetch(kb_id=kb_id, for_update=True)
    if kb.is_deleted:
        raise _knowledge_base_deleted(kb)
    authorize_knowledge_base(principal, kb.id, write=True)
    fields = [name for name in ("name", "description", "status", "vector_compression") if name in changes]
    for name in fields:
        setattr(kb, name, changes[name])
    if fields:
        _save_unique_name(kb, update_fields=[*fields, "updated_at"])
        logger.info("knowledge_base_updated", knowledge_base_id=str(kb.id), fields=fields)
    return knowledge_base_fetch(kb_id=kb.id)


@transaction.atomic
def knowledge_base_delete(*, principal: Principal, kb_id: str | uuid.UUID) -> CleanupTask:
    """软删除：立即置为 deleted（此后不可检索、不可写），并创建异步清理任务。"""
    kb = knowledge_base_fetch(kb_id=kb_id, for_update=True)
    if kb.is_deleted:
        raise _knowledge_base_deleted(kb)
    authorize_knowledge_base(principal, kb.id, write=True)
    kb.status = KnowledgeBase.Status.DELETED
    kb.deleted_at = timezone.now()
    kb.save(update_fields=["status", "deleted_at", "updated_at"])
    task = CleanupTask.objects.create(knowledge_base=kb, request_id=current_request_id() or "")
    cleanup_submit(task)
    logger.info("knowledge_base_deleted", knowledge_base_id=str(kb.id), cleanup_task_id=str(task.id))
    return task


@transaction.atomic
def cleanup_task_retry(*, principal: Principal, task_id: str | uuid.UUID) -> CleanupTask:
    """人工重试：只允许 failed；重置为 pending（processed 归零、total 重新统计）后重新入队。"""
    parsed = parse_uuid(task_id)
    task = CleanupTask.objects.select_for_update().filter(pk=parsed).first() if parsed else None
    if task is None:
        raise cleanup_task_not_found(task_id)
    if task.status != CleanupTask.Status.FAILED:
        raise ApplicationError(
            ErrorCode.CLEANUP_TASK_NOT_RETRYABLE,
            f"Cleanup task '{task.id}' is {task.status}; only failed tasks can be retried",
            409,
            [ErrorDetail("status", "NOT_RETRYABLE", f"Current status is {task.status}")],
        )
    authorize_knowledge_base(principal, task.knowledge_base_id, write=True)
    task.status = CleanupTask.Status.PENDING
    task.processed = 0
    task.total = None
    task.error_message = ""
    task.started_at = None
    task.finished_at = None
    task.request_id = current_request_id() or task.request_id
    task.save()
    # 新的一轮：新的作业，尝试次数与 worker 死亡次数从零算起
    cleanup_submit(task)
    logger.info("cleanup_task_retried", cleanup_task_id=str(task.id))
    return task
