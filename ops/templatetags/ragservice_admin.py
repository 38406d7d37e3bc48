"""管理后台首页的概览模块（inclusion tag）：数字由 ops.dashboard 的选择器算出，模板只负责展示。"""

from __future__ import annotations

from typing import Any

from django import template

from ops.dashboard import FAILURE_WINDOW, dashboard_figures

register = template.Library()


@register.inclusion_tag("admin/ragservice_dashboard.html")
def ragservice_dashboard() -> dict[str, Any]:
    return {"dashboard": dashboard_figures(), "window_hours": int(FAILURE_WINDOW.total_seconds() // 3600)}
