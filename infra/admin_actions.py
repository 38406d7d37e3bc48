"""管理后台批量动作的共用逻辑：逐条调用服务层，成功与业务拒绝分别提示。"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.contrib import admin, messages
from django.http import HttpRequest

from infra.errors import ApplicationError

T = TypeVar("T")


def apply_service(
    model_admin: admin.ModelAdmin,  # type: ignore[type-arg]
    request: HttpRequest,
    items: Iterable[T],
    action: Callable[[T], Any],
    *,
    label: Callable[[T], str],
    success: Callable[[T, Any], str],
) -> int:
    """对每一项执行 action；返回成功数。服务层的 ApplicationError 变成一条警告，不中断其余项。"""
    done = 0
    for item in items:
        try:
            result = action(item)
        except ApplicationError as exc:
            model_admin.message_user(request, f"{label(item)}: {exc.message}", messages.WARNING)
            continue
        done += 1
        message = success(item, result)
        if message:
            model_admin.message_user(request, message)
    return done
