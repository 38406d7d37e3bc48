"""知识库与清理任务的管理后台。删除与重试都经过服务层，与 API 行为一致。"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, Q, QuerySet, Sum
from django.http import HttpRequest, HttpResponseRedirect
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html

from infra.admin_actions import apply_service
from infra.errors import ApplicationError
from infra.principal import SYSTEM_PRINCIPAL
from knowledge import services
from knowledge.models import CleanupTask, KnowledgeBase


def _short_time(value: datetime | None) -> str:
    """列表里只显示日期，悬停看到分钟。"""
    if value is None:
        return "—"
    local = timezone.localtime(value)
    return format_html('<span title="{}">{}</span>', date_format(local, "Y-m-d H:i"), date_format(local, "Y-m-d"))


@admin.register(KnowledgeBase)
class KnowledgeBaseAdmin(admin.ModelAdmin):
    list_display = ["name", "status", "document_total", "chunk_total", "embedding", "created", "updated", "deleted"]
    list_filter = ["status"]
    search_fields = ["name", "description"]
    # 向量索引压缩只读显示：改它会让定时任务重建该库的 HNSW 索引，经 API 的 PATCH 修改
    readonly_fields = ["id", "vector_compression", "created_at", "updated_at", "deleted_at"]
    actions = ["enable", "disable", "soft_delete"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[KnowledgeBase]:
        """列表的文档数与分块数在同一条查询里聚合（不是每行一次查询）。

        文档数不含已删除的墓碑；分块数与首页概览（ops.dashboard）同一口径：已完成文档的 chunk_count 之和——
        对 document_chunks 计数在大库上是全表扫描。状态写成字面值：documents 在上一层，这里不能导入
        ``Document.Status``（取值由 documents_status_valid 约束固定）。
        """
        return super().get_queryset(request).annotate(
            document_total=Count("documents", filter=~Q(documents__status="deleted")),
            chunk_total=Sum("documents__chunk_count", filter=Q(documents__status="completed")),
        )

    @admin.display(description="文档数", ordering="document_total")
    def document_total(self, obj: KnowledgeBase) -> int:
        return int(getattr(obj, "document_total", 0) or 0)

    @admin.display(description="分块数", ordering="chunk_total")
    def chunk_total(self, obj: KnowledgeBase) -> int:
        return int(getattr(obj, "chunk_total", 0) or 0)

    @admin.display(description="Embedding 模型", ordering="embedding_model")
    def embedding(self, obj: KnowledgeBase) -> str:
        # 窄列里优先在冒号后折行，而不是把模型名从中间断开
        return format_html('<span title="{} 维">{}:<wbr>{}</span>', obj.embedding_dimension, obj.embedding_provider,
                           obj.embedding_model)

    # 完整日期（“2026年11月25日 04:33”）三列并排会把列表挤出横向滚动条：列表里只有日期，详情页是完整时间
    @admin.display(description="创建于", ordering="created_at")
    def created(self, obj: KnowledgeBase) -> str:
        return _short_time(obj.created_at)

    @admin.display(description="更新于", ordering="updated_at")
    def updated(self, obj: KnowledgeBase) -> str:
        return _short_time(obj.updated_at)

    @admin.display(description="删除于", ordering="deleted_at")
    def deleted(self, obj: KnowledgeBase) -> str:
        return _short_time(obj.deleted_at)

    def has_change_permission(self, request: HttpRequest, obj: KnowledgeBase | None = None) -> bool:
        # 已删除的知识库不可恢复或修改：详情页只读（仍可查看，供审计）
        if obj is not None and obj.is_deleted:
            return False
        return super().has_change_permission(request, obj)

    def formfield_for_choice_field(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # 表单里只能在 enabled/disabled 之间切换；删除走“删除并清理”动作
        if db_field.name == "status":
            kwargs["choices"] = [c for c in KnowledgeBase.Status.choices if c[0] != KnowledgeBase.Status.DELETED]
        return super().formfield_for_choice_field(db_field, request, **kwargs)

    def has_delete_permission(self, request: HttpRequest, obj: KnowledgeBase | None = None) -> bool:
        # 禁止硬删除：必须软删除并由清理任务级联删除分块与向量
        return False

    def save_model(self, request: HttpRequest, obj: KnowledgeBase, form: Any, change: bool) -> None:
        try:
            if change:
                services.knowledge_base_update(
                    principal=SYSTEM_PRINCIPAL,
                    kb_id=obj.id,
                    changes={name: getattr(obj, name) for name in form.changed_data},
                )
            else:
                created = services.knowledge_base_create(
                    principal=SYSTEM_PRINCIPAL, name=obj.name, description=obj.description
                )
                obj.pk = created.pk
                obj._state.adding = False
        except ApplicationError as exc:
            # 服务层拒绝（如并发下的重名）：记下失败，随后的日志与“保存成功”跳转都要跳过
            request._service_error = exc  # type: ignore[attr-defined]
            self.message_user(request, exc.message, messages.ERROR)

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if not hasattr(request, "_service_error"):
            return super().log_change(request, obj, message)
        return None

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if not hasattr(request, "_service_error"):
            return super().log_addition(request, obj, message)
        return None

    def response_add(self, request: HttpRequest, obj: KnowledgeBase, post_url_continue: str | None = None) -> Any:
        if hasattr(request, "_service_error"):
            return HttpResponseRedirect(request.path)
        return super().response_add(request, obj, post_url_continue)

    def response_change(self, request: HttpRequest, obj: KnowledgeBase) -> Any:
        if hasattr(request, "_service_error"):
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)

    def _set_status(self, request: HttpRequest, queryset: QuerySet[KnowledgeBase], status: str) -> None:
        done = apply_service(
            self, request, queryset,
            lambda kb: services.knowledge_base_update(principal=SYSTEM_PRINCIPAL, kb_id=kb.id,
                                                      changes={"status": status}),
            label=lambda kb: kb.name, success=lambda kb, _: "",
        )
        self.message_user(request, f"{done} 个知识库已设为 {status}")

    @admin.action(description="启用所选知识库")
    def enable(self, request: HttpRequest, queryset: QuerySet[KnowledgeBase]) -> None:
        self._set_status(request, queryset, KnowledgeBase.Status.ENABLED)

    @admin.action(description="禁用所选知识库（不可检索）")
    def disable(self, request: HttpRequest, queryset: QuerySet[KnowledgeBase]) -> None:
        self._set_status(request, queryset, KnowledgeBase.Status.DISABLED)

    @admin.action(description="删除所选知识库并异步清理")
    def soft_delete(self, request: HttpRequest, queryset: QuerySet[KnowledgeBase]) -> None:
        apply_service(self, request, queryset,
                      lambda kb: services.knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id),
                      label=lambda kb: kb.name, success=lambda kb, task: f"{kb.name}: 已删除，清理任务 {task.id}")


@admin.register(CleanupTask)
class CleanupTaskAdmin(admin.ModelAdmin):
    list_display = ["id", "knowledge_base", "status", "progress_display", "attempts", "next_retry_at", "updated_at"]
    list_filter = ["status"]
    search_fields = ["id", "knowledge_base__name", "error_message"]
    list_select_related = ["knowledge_base"]
    actions = ["retry"]
    fields = ("id", "knowledge_base", "status", "processed", "total", "attempts", "error_message",
              "next_retry_at", "request_id", "created_at", "updated_at", "started_at", "finished_at")
    readonly_fields = fields

    @admin.display(description="进度")
    def progress_display(self, obj: CleanupTask) -> str:
        progress = obj.progress
        if progress["percentage"] is None:
            return f"{obj.processed} / ?"
        return f"{obj.processed} / {obj.total}（{progress['percentage']:.0%}）"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: CleanupTask | None = None) -> bool:
        return False

    @admin.action(description="重试所选失败任务")
    def retry(self, request: HttpRequest, queryset: QuerySet[CleanupTask]) -> None:
        apply_service(self, request, queryset,
                      lambda task: services.cleanup_task_retry(principal=SYSTEM_PRINCIPAL, task_id=task.id),
                      label=lambda task: f"任务 {task.id}", success=lambda task, _: f"任务 {task.id} 已重新排队")
