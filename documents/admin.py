"""文档与分块的管理后台：查看状态、错误、耗时，重新索引；分块只读，可全文搜索。"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from documents import services
from documents.models import Document, DocumentChunk, KnowledgeDomain
from ops.auth import SYSTEM_PRINCIPAL
from ragservice.admin_actions import apply_service


class _ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # 删除必须经过服务层（留墓碑、删分块与原始文件）
        return False


@admin.register(Document)
class DocumentAdmin(_ReadOnlyAdmin):
    list_display = ["filename", "knowledge_base", "status", "stage", "chunk_count", "ocr_skipped",
                    "reindex_status", "updated_at"]
    list_filter = ["status", "reindex_status", "ocr_skipped", "format"]
    search_fields = ["filename", "id", "external_id", "error_message"]
    list_select_related = ["knowledge_base"]
    readonly_fields = [f.name for f in Document._meta.fields]
    actions = ["reindex", "soft_delete"]

    @admin.action(description="重新索引所选文档")
    def reindex(self, request: HttpRequest, queryset: QuerySet[Document]) -> None:
        apply_service(self, request, queryset,
                      lambda d: services.document_reindex(principal=SYSTEM_PRINCIPAL, document_id=d.id),
                      label=lambda d: d.filename, success=lambda d, _: f"{d.filename}: 已排队重新索引")

    @admin.action(description="删除所选文档（保留墓碑）")
    def soft_delete(self, request: HttpRequest, queryset: QuerySet[Document]) -> None:
        apply_service(self, request, queryset,
                      lambda d: services.document_delete(principal=SYSTEM_PRINCIPAL, document_id=d.id),
                      label=lambda d: d.filename, success=lambda d, _: f"{d.filename}: 已删除")


@admin.register(DocumentChunk)
class DocumentChunkAdmin(_ReadOnlyAdmin):
    list_display = ["id", "document", "chunk_index", "role", "token_count", "embedding_dim", "short_text"]
    list_filter = ["role", "embedding_dim"]
    search_fields = ["chunk_text"]
    list_select_related = ["document"]
    exclude = ["embedding"]
    readonly_fields = ["knowledge_base", "document", "chunk_index", "role", "parent", "token_count",
                       "embedding_dim", "text_hash", "chunk_text", "metadata", "created_at"]

    @admin.display(description="文本")
    def short_text(self, obj: DocumentChunk) -> str:
        return obj.chunk_text[:80] + ("…" if len(obj.chunk_text) > 80 else "")


@admin.register(KnowledgeDomain)
class KnowledgeDomainAdmin(_ReadOnlyAdmin):
    """目录导入 / domain 同步的状态：只读，由 import_knowledge 与同步 API 维护。"""

    list_display = ["domain", "knowledge_base", "version", "status", "item_count", "synced_at"]
    list_filter = ["status"]
    search_fields = ["domain"]
    list_select_related = ["knowledge_base"]
    readonly_fields = [f.name for f in KnowledgeDomain._meta.fields]
