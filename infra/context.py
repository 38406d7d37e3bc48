"""请求 ID 的上下文传递：HTTP 请求 → 日志 → django-q2 任务。

请求 ID 存在 structlog 的 contextvars 里；入队时由 ``enqueue`` 把当前 ID 作为关键字参数
传给任务，任务里用 ``task_context`` 重新绑定，于是 worker 的日志行与触发它的请求同 ID。
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog
from django.db import transaction

REQUEST_ID_KEY = "request_id"


def new_request_id() -> str:
    """生成 UUID v4 字符串。"""
    return str(uuid.uuid4())


def current_request_id() -> str | None:
    """当前上下文中的请求 ID（不在请求/任务中时为 None）。"""
    value = structlog.contextvars.get_contextvars().get(REQUEST_ID_KEY)
    return str(value) if value is not None else None


@contextmanager
def task_context(task: str, request_id: str | None, **fields: Any) -> Iterator[None]:
    """在后台任务中恢复请求 ID（没有来源请求时新建一个），并绑定任务名等字段。"""
    bound = {REQUEST_ID_KEY: request_id or new_request_id(), "task": task, **fields}
    with structlog.contextvars.bound_contextvars(**bound):
        yield


def enqueue(func: str, *args: Any, **kwargs: Any) -> None:
    """事务提交后再把任务放进 django-q2 队列，并带上当前请求 ID。

    数据库行是任务的事实记录：若事务回滚，任务根本不该入队；若先入队后提交，worker
    可能读不到尚未提交的行。
    """
    # django_q.tasks 导入时加载模型，而管道层在应用注册表就绪之前就会被导入：只能在调用时导入
    from django_q.tasks import async_task

    kwargs.setdefault(REQUEST_ID_KEY, current_request_id())
    transaction.on_commit(lambda: async_task(func, *args, **kwargs))
