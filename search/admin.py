"""管理后台：知识库学出的相关概率模型（只读展示拟合结果；重新拟合用 ``manage.py fit_relevance``）。"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from search.models import RelevanceProfile


@admin.register(RelevanceProfile)
class RelevanceProfileAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("knowledge_base", "embedding_model", "queries", "rank_hybrid", "hybrid_self_test", "fitted_at")
    list_select_related = ("knowledge_base",)
    readonly_fields = ("knowledge_base", "embedding_model", "mode_models", "rank_hybrid", "chunk_count", "queries",
                       "seed", "validation", "fitted_at")

    @admin.display(description="混合检索自测 MRR（模型 / RRF）")
    def hybrid_self_test(self, profile: RelevanceProfile) -> str:
        values = profile.validation.get("hybrid")
        return f"{values['mrr_model']:.3f} / {values['mrr_original']:.3f}" if values else "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # 模型只能拟合出来（manage.py fit_relevance），不能手填

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
