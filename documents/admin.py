"""文档与分块的管理后台：查看状态、错误、耗时，重新索引；分块只读，可全文搜索。"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html

from documents import services
from documents.models import Document, DocumentChunk, KnowledgeDomain
from documents.stages import stage_progress
from infra.admin_actions import apply_service
from infra.principal import SYSTEM_PRINCIPAL


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
    list_display = ["filename", "knowledge_base", "state", "chunk_count", "ocr", "error_summary", "updated"]
    list_filter = ["status", "reindex_status", "ocr_skipped", "format", "knowledge_base"]
    search_fields = ["filename", "id", "external_id", "error_message"]
    list_select_related = ["knowledge_base"]
    readonly_fields = [*(f.name for f in Document._meta.fields), "state", "ocr"]
    # 详情页与列表用同样的“状态与进度”“OCR”说明，不显示布尔图标
    fieldsets = [
        (None, {"fields": ["filename", "knowledge_base", "state", "error_message", "chunk_count", "format",
                           "size_bytes", "ocr"]}),
        ("处理记录", {"fields": ["stage_timings", "attempts", "next_retry_at", "request_id", "created_at",
                             "updated_at", "finished_at"]}),
        ("文件与参数", {"classes": ["collapse"],
                        "fields": ["id", "metadata", "chunking", "sha256", "stored_path"]}),
    ]
    actions = ["reindex", "soft_delete"]

    @admin.display(description="状态与进度", ordering="status")
    def state(self, obj: Document) -> str:
        """处理中的文档显示当前阶段与进度条；失败标红；正在重新索引的已完成文档同样显示阶段。"""
        busy = obj.status == Document.Status.PROCESSING or obj.reindex_status == Document.Reindex.RUNNING
        if busy:
            progress = stage_progress(obj.stage)
            prefix = "重新索引 · " if obj.status == Document.Status.COMPLETED else ""
            step = f"{progress.step}/{progress.steps} " if progress.step else ""
            return format_html('{}<span class="rag-bar" title="{}%"><span style="width: {}%"></span></span> '
                               '<span class="rag-quiet">{}{}</span>', prefix, progress.percent, progress.percent,
                               step, progress.label)
        label = obj.get_status_display()
        if obj.reindex_status == Document.Reindex.FAILED:
            label += "（重新索引失败）"
        return format_html('<span class="rag-status-{}">{}</span>', obj.status, label)

    @admin.display(description="OCR", ordering="ocr_skipped")
    def ocr(self, obj: Document) -> str:
        # 布尔图标（红色 ✗）会被读成“出错了”；这里是中性的说明
        if obj.ocr_skipped:
            return "跳过"
        return f"未跳过（{obj.ocr_engine}）" if obj.ocr_engine else "未跳过"

    @admin.display(description="更新于", ordering="updated_at")
    def updated(self, obj: Document) -> str:
        # 完整日期（“2026年11月25日 04:33”）太宽，会把列表挤出横向滚动条；年份在详情页
        return date_format(timezone.localtime(obj.updated_at), "m-d H:i")

    @admin.display(description="错误")
    def error_summary(self, obj: Document) -> str:
        if not obj.error_message:
            return "—"
        short = obj.error_message if len(obj.error_message) <= 120 else obj.error_message[:119] + "…"
        return format_html('<span title="{}">{}</span>', obj.error_message, short)

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
    # 文本在最前；向量与 tsvector 是给机器用的，不在详情页展示（tsvector 原文一屏都放不下）
    fieldsets = [
        (None, {"fields": ["chunk_text", "document", "knowledge_base", "chunk_index", "role", "parent"]}),
        ("元数据", {"fields": ["metadata"]}),
        ("索引", {"fields": ["token_count", "embedding_dim", "search_length", "text_hash", "created_at"]}),
    ]
    readonly_fields = ["knowledge_base", "document", "chunk_index", "role", "parent", "token_count",
                       "embedding_dim", "search_length", "text_hash", "chunk_text", "metadata", "created_at"]

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
