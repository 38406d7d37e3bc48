"""文档的读取。"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from django.db import connection

from documents.filters import SearchFilters
from documents.models import Document
from infra.errors import ApplicationError, ErrorCode, ErrorDetail, not_found
from infra.principal import Principal, authorize_knowledge_base
from jobs.runner import latest_jobs
from knowledge.models import KnowledgeBase
from knowledge.selectors import knowledge_base_fetch, parse_uuid


def document_not_found(document_id: object) -> ApplicationError:
    return not_found(ErrorCode.DOCUMENT_NOT_FOUND, "Document", "document_id", document_id)


def document_fetch(*, document_id: str | uuid.UUID, for_update: bool = False) -> Document:
    """按 id 取文档（含墓碑），从未存在抛 404 DOCUMENT_NOT_FOUND。"""
    parsed = parse_uuid(document_id)
    queryset = Document.objects.select_related("knowledge_base")
    if for_update:
        queryset = queryset.select_for_update(of=("self",))
    document = queryset.filter(pk=parsed).first() if parsed else None
    if document is None:
        raise document_not_found(document_id)
    return document


def document_get(*, principal: Principal, document_id: str | uuid.UUID) -> Document:
    """详情：墓碑（deleted）也返回，便于调用方区分“已删除”与“从未存在”。"""
    document = document_fetch(document_id=document_id)
    authorize_knowledge_base(principal, document.knowledge_base_id, write=False)
    return document


def document_list(
    *, principal: Principal, kb_id: str | uuid.UUID, page: int, page_size: int, statuses: Sequence[str] | None
) -> tuple[KnowledgeBase, list[Document], int]:
    """某知识库下的文档分页列表（已删除的知识库也可查看，供审计）。"""
    kb = knowledge_base_fetch(kb_id=kb_id)
    authorize_knowledge_base(principal, kb.id, write=False)
    queryset = Document.objects.filter(knowledge_base=kb)
    if statuses:
        queryset = queryset.filter(status__in=list(statuses))
    total = queryset.count()
    offset = (page - 1) * page_size
    documents = list(queryset.order_by("-created_at", "id")[offset : offset + page_size])
    # 每行的尝试次数、下次重试来自它最近的作业：一条查询取齐，不逐行查
    jobs = latest_jobs(document.pk for document in documents)
    for document in documents:
        document.job = jobs.get(document.pk)
    return kb, documents, total


def item_get(*, kb: KnowledgeBase, external_id: str) -> Document:
    """按外部 id 取条目；不存在抛 404 ITEM_NOT_FOUND。"""
    # 经 DELETE /documents/{id} 删除的条目留有墓碑：对条目接口而言就是不存在
    document = Document.objects.filter(knowledge_base=kb, external_id=external_id).exclude(
        status=Document.Status.DELETED).first()
    if document is None:
        raise item_not_found(external_id)
    return document


def item_list(*, kb: KnowledgeBase, filters: SearchFilters, page: int,
              page_size: int) -> tuple[list[Document], int]:
    """按元数据过滤的条目分页列表（即不带查询的 search_knowledge）。

    过滤条件与 ``POST /search`` 共用 :class:`SearchFilters` 生成的 SQL（文档行同样带有 title/domain/category/tags
    元数据），在数据库里过滤与分页，选择性再高也不会把一页过滤空。
    """
    extra, params = filters.sql()
    scope = f"FROM documents c WHERE c.knowledge_base_id = %s AND c.external_id <> '' AND c.status <> 'deleted'{extra}"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) {scope}", [kb.id, *params])
        total = int(cursor.fetchone()[0])
    offset = (page - 1) * page_size
    rows = Document.objects.raw(f"SELECT c.* {scope} ORDER BY c.updated_at DESC, c.id LIMIT %s OFFSET %s",
                                [kb.id, *params, page_size, offset])
    return list(rows), total


def item_not_found(external_id: str) -> ApplicationError:
    return ApplicationError(ErrorCode.ITEM_NOT_FOUND, f"Knowledge item '{external_id}' not found", 404,
                            [ErrorDetail("external_id", "NOT_FOUND", "Resource does not exist")])
