"""文档与分块的管理后台：查看状态、错误、耗时，重新索引；分块只读，可全文搜索。

上传的文件与知识条目（``external_id`` 非空的文档行）在同一个列表里，用“类型”列与筛选区分。
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join

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


# 列表的错误列最多显示这么多字符（折行显示），全文在悬停提示与详情页里
ERROR_PREVIEW_CHARS = 200

# 详情页“各阶段耗时”的顺序与中文名；stage_timings 的键是 ``<阶段>_ms``（见 documents.ingestion.Run.timings_ms）。
# OCR 的耗时从解析里单独拿出来记，所以这里的“解析”不含 OCR
TIMING_LABELS = {"parse": "解析", "ocr": "OCR", "chunk": "分块", "embed": "向量化", "store": "写入"}


class DocumentKindFilter(admin.SimpleListFilter):
    """按类型筛选：上传的文件，或 Agent 按外部 id 写入的知识条目。"""

    title = "类型"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:  # type: ignore[type-arg]
        return [("file", "上传文件"), ("item", "知识条目")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Document]) -> QuerySet[Document]:
        if self.value() == "file":
            return queryset.filter(external_id="")
        if self.value() == "item":
            return queryset.exclude(external_id="")
        return queryset


def format_milliseconds(value: float) -> str:
    """耗时的显示：千位分隔、1 秒以内保留一位小数（``12.3 ms``、``1,234 ms``）。"""
    return f"{value:,.1f} ms" if value < 1000 else f"{value:,.0f} ms"


def share(part: float, total: float) -> str:
    """占比：不到 1% 的写“<1%”，不写成误导的“0%”。"""
    if total <= 0:
        return "—"
    ratio = part / total
    return "<1%" if 0 < ratio < 0.005 else f"{ratio:.0%}"


@admin.register(Document)
class DocumentAdmin(_ReadOnlyAdmin):
    list_display = ["filename", "kind", "knowledge_base", "state", "chunk_count", "ocr", "error_summary", "updated"]
    list_filter = [DocumentKindFilter, "status", "reindex_status", "ocr_skipped", "format", "knowledge_base"]
    search_fields = ["filename", "id", "external_id", "error_message"]
    list_select_related = ["knowledge_base"]
    readonly_fields = [*(f.name for f in Document._meta.fields), "kind", "state", "ocr", "timings", "attempts",
                       "next_retry_at"]
    # 详情页与列表用同样的“状态与进度”“OCR”说明，不显示布尔图标；耗时是一张小表，不是 JSON 原文
    fieldsets = [
        (None, {"fields": ["filename", "kind", "knowledge_base", "state", "error_message", "chunk_count", "format",
                           "size_bytes", "ocr"]}),
        ("处理记录", {"fields": ["timings", "attempts", "next_retry_at", "request_id", "created_at",
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

    @admin.display(description="类型", ordering="external_id")
    def kind(self, obj: Document) -> str:
        return "知识条目" if obj.external_id else "上传文件"

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
        """折行显示（样式见 templates/admin/base_site.html，长路径、长单词也会断开，不撑宽列表）；
        超过 ``ERROR_PREVIEW_CHARS`` 的截断，全文在悬停提示与详情页里。"""
        message = obj.error_message
        if not message:
            return "—"
        if len(message) <= ERROR_PREVIEW_CHARS:
            return format_html('<span class="rag-error">{}</span>', message)
        return format_html('<span class="rag-error" title="{}">{}…</span>', message,
                           message[:ERROR_PREVIEW_CHARS - 1])

    @admin.display(description="各阶段耗时")
    def timings(self, obj: Document) -> str:
        """``{"parse_ms": 812.4, …}`` → 阶段（中文）、毫秒、占比的小表，按流水线顺序，最后一行合计。"""
        values: dict[str, float] = {}
        for key, value in (obj.stage_timings or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                values[key.removesuffix("_ms")] = float(value)
        if not values:
            return "—"
        order = [*[name for name in TIMING_LABELS if name in values],
                 *sorted(name for name in values if name not in TIMING_LABELS)]
        total = sum(values.values())
        rows = format_html_join(
            "", '<tr><th scope="row">{}</th><td class="num">{}</td><td class="num">{}</td></tr>',
            ((TIMING_LABELS.get(name, name), format_milliseconds(values[name]),
              share(values[name], total)) for name in order),
        )
        return format_html('<table class="rag-timings"><thead><tr><th>阶段</th><th class="num">耗时</th>'
                           '<th class="num">占比</th></tr></thead><tbody>{}</tbody><tfoot><tr><th scope="row">合计'
                           '</th><td class="num">{}</td><td class="num"></td></tr></tfoot></table>',
                           rows, format_milliseconds(total))

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
