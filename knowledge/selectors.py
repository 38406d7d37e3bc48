"""知识库与清理任务的读取。"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from django.db.models import OuterRef, QuerySet, Subquery

from infra.api import canonical_uuid
from infra.errors import ApplicationError, ErrorCode, ErrorDetail, not_found
from infra.principal import Principal, authorize_knowledge_base
from knowledge.models import CleanupTask, KnowledgeBase

# 不指定 status 过滤时列出的状态；已删除的知识库需显式 status=deleted 才列出（审计用）
DEFAULT_LIST_STATUSES = (KnowledgeBase.Status.ENABLED, KnowledgeBase.Status.DISABLED)


def knowledge_base_by_name_or_id(value: str) -> KnowledgeBase | None:
    """运维命令里的知识库参数：先按名称，再按 id；都找不到时为 None。"""
    kb = KnowledgeBase.objects.filter(name=value).first()
    if kb is None and (parsed := parse_uuid(value)) is not None:
        kb = KnowledgeBase.objects.filter(pk=parsed).first()
    return kb


def parse_uuid(value: str | uuid.UUID) -> uuid.UUID | None:
    """路径里的 id 不是标准写法的 UUID（无连字符、带花括号的也不算）时视为“不存在”，而不是校验错误。"""
    return canonical_uuid(value)


def knowledge_base_not_found(kb_id: object) -> ApplicationError:
    return not_found(ErrorCode.KNOWLEDGE_BASE_NOT_FOUND, "Knowledge base", "knowledge_base_id", kb_id)


def cleanup_task_not_found(task_id: object) -> ApplicationError:
    return not_found(ErrorCode.CLEANUP_TASK_NOT_FOUND, "Cleanup task", "task_id", task_id)


def knowledge_base_unavailable(kb: KnowledgeBase) -> ApplicationError:
    """可用性校验失败（disabled/deleted）：不暴露任何内部存储信息。"""
    return ApplicationError(
        ErrorCode.KNOWLEDGE_BASE_UNAVAILABLE,
        f"Knowledge base '{kb.id}' is {kb.status} and cannot be used",
        403,
        [ErrorDetail("knowledge_base_id", "UNAVAILABLE", f"Knowledge base status is {kb.status}")],
    )


def _with_latest_cleanup(queryset: QuerySet[KnowledgeBase]) -> QuerySet[KnowledgeBase]:
    latest = CleanupTask.objects.filter(knowledge_base=OuterRef("pk")).order_by("-created_at").values("id")[:1]
    return queryset.annotate(latest_cleanup_task_id=Subquery(latest))


def knowledge_base_fetch(*, kb_id: str | uuid.UUID, for_update: bool = False,
                         with_cleanup_task: bool = True) -> KnowledgeBase:
    """按 id 取知识库（存在性校验），不存在抛 404 KNOWLEDGE_BASE_NOT_FOUND。

    ``with_cleanup_task``：带上最近一次清理任务的 id（详情接口展示）。检索、上传前的校验用不到它，
    传 False 省掉那个子查询（每个检索请求都要经过这里）。加锁读取时不带。
    """
    parsed = parse_uuid(kb_id)
    if parsed is None:
        raise knowledge_base_not_found(kb_id)
    if for_update or with_cleanup_task:
        queryset = KnowledgeBase.objects.all()
        queryset = queryset.select_for_update() if for_update else _with_latest_cleanup(queryset)
        kb = queryset.filter(pk=parsed).first()
    else:
        # 每个检索、上传请求都经过这里：写好的 SQL，不让 ORM 每次编译（约 0.3 ms，执行只要几十微秒）
        kb = next(iter(KnowledgeBase.objects.raw("SELECT * FROM knowledge_bases WHERE id = %s", [parsed])), None)
    if kb is None:
        raise knowledge_base_not_found(kb_id)
    return kb


def usable_knowledge_base(*, principal: Principal, kb_id: str | uuid.UUID, write: bool) -> KnowledgeBase:
    """上传、检索前的三步校验：存在（404）→ 可用（403 UNAVAILABLE）→ 权限（403）。"""
    kb = knowledge_base_fetch(kb_id=kb_id, with_cleanup_task=False)
    if not kb.is_enabled:
        raise knowledge_base_unavailable(kb)
    authorize_knowledge_base(principal, kb.id, write=write)
    return kb


def knowledge_base_get(*, principal: Principal, kb_id: str | uuid.UUID) -> KnowledgeBase:
    """详情：已删除的知识库仍可查看（审计），只需读权限。"""
    kb = knowledge_base_fetch(kb_id=kb_id)
    authorize_knowledge_base(principal, kb.id, write=False)
    return kb


def knowledge_base_list(
    *,
    principal: Principal,
    page: int,
    page_size: int,
    name_contains: str | None = None,
    statuses: Sequence[str] | None = None,
) -> tuple[list[KnowledgeBase], int]:
    """分页列出调用方可见的知识库，返回 (本页条目, 总数)。"""
    queryset = KnowledgeBase.objects.filter(status__in=list(statuses or DEFAULT_LIST_STATUSES))
    if not principal.all_knowledge_bases:
        queryset = queryset.filter(pk__in=principal.knowledge_base_ids)
    if name_contains:
        queryset = queryset.filter(name__icontains=name_contains)
    total = queryset.count()
    offset = (page - 1) * page_size
    items = list(_with_latest_cleanup(queryset).order_by("-created_at", "id")[offset : offset + page_size])
    return items, total


def cleanup_task_get(*, principal: Principal, task_id: str | uuid.UUID) -> CleanupTask:
    """清理任务详情；权限按其所属知识库判定。"""
    parsed = parse_uuid(task_id)
    task = CleanupTask.objects.filter(pk=parsed).first() if parsed else None
    if task is None:
        raise cleanup_task_not_found(task_id)
    authorize_knowledge_base(principal, task.knowledge_base_id, write=False)
    return task
