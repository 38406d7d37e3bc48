"""API key 管理：新建或轮换时明文只显示一次。"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from ops.admin_login import ThrottledAdminAuthenticationForm
from ops.models import ApiKey

# 登录失败次数过多时拒绝登录（ops.admin_login）；/admin/login/ 由 ops.admin_login.admin_login 接管，回 429
admin.site.login_form = ThrottledAdminAuthenticationForm


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "key_prefix", "access", "all_knowledge_bases", "is_active", "created_at", "last_used_at"]
    list_filter = ["access", "is_active", "all_knowledge_bases"]
    search_fields = ["name", "key_prefix"]
    filter_horizontal = ["knowledge_bases"]
    fields = ["name", "access", "all_knowledge_bases", "knowledge_bases", "is_active",
              "key_prefix", "created_at", "last_used_at"]
    readonly_fields = ["key_prefix", "created_at", "last_used_at"]
    actions = ["rotate", "revoke"]

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        raw = None if change else obj.set_new_key()
        super().save_model(request, obj, form, change)
        if raw:
            self.message_user(request, f"API key「{obj.name}」已创建，请立即保存（只显示这一次）：{raw}",
                              messages.WARNING)

    @admin.action(description="轮换密钥（旧密钥立即失效）")
    def rotate(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset:
            raw = key.set_new_key()
            key.save(update_fields=["key_hash", "key_prefix"])
            self.message_user(request, f"「{key.name}」的新密钥（只显示这一次）：{raw}", messages.WARNING)

    @admin.action(description="吊销所选密钥")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = queryset.update(is_active=False)
        self.message_user(request, f"已吊销 {count} 把密钥")
