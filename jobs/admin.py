"""后台作业的只读列表：维护者在这里看每件工作排在哪个队列、试了几次、租约在谁手里、最近的错误。"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from jobs.models import Job


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["kind", "target_id", "queue", "status", "attempt", "worker_deaths", "run_after", "heartbeat_at",
                    "updated_at"]
    list_filter = ["kind", "status", "queue"]
    search_fields = ["id", "target_id", "error"]
    readonly_fields = [f.name for f in Job._meta.fields]

    # 作业只由执行器写：后台里改它会绕过租约
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False
