"""管理后台：知识库学出的相关概率模型（只读展示拟合结果；重新拟合用 ``manage.py fit_relevance``）。"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from search.models import RelevanceProfile


@admin.register(RelevanceProfile)
class RelevanceProfileAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("knowledge_base", "embedding_model", "chunk_count", "queries", "hybrid_self_test", "fitted_at")
    list_select_related = ("knowledge_base",)
    readonly_fields = ("knowledge_base", "embedding_model", "mode_models", "chunk_count", "document_chunk_count",
                       "revision", "queries", "seed", "validation", "fitted_at")

    @admin.display(description="混合检索自测（0.5 处精确率 / 召回率，无答案时第一名均值）")
    def hybrid_self_test(self, profile: RelevanceProfile) -> str:
        values = profile.validation.get("hybrid")
        if not values:
            return "—（用全局校准）"
        return f"{values['precision']:.2f} / {values['recall']:.2f}，{values.get('absent_top1_mean', 0.0):.2f}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # 模型只能拟合出来（manage.py fit_relevance），不能手填

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
