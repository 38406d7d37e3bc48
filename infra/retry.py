"""后台任务的延迟重试：django-q2 没有按任务的退避，这里用一次性 Schedule 安排下一次尝试。
另有任务开始前、记录失败前的数据库重连：数据库重启后 worker 手里的连接全是死的。"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

logger = structlog.get_logger(__name__)

# 等数据库回来的总时长上限（秒）：超过就放弃这次，交给租约过期后的回收器或下一次投递
DATABASE_WAIT_SECONDS = 60.0


def backoff_seconds(base: int, attempt: int) -> int:
    """第 attempt 次尝试失败后的等待：base·2^(attempt-1)，即 1、2、4 倍……"""
    return int(base * 2 ** (attempt - 1))


def database_ready(*, wait_seconds: float = DATABASE_WAIT_SECONDS) -> None:
    """丢掉过期或已断开的连接，并确认能重新连上；连不上按 1、2、4…… 秒退避重试，总时长有上限。

    django-q2 在每个任务前只做 ``close_old_connections``：断在任务中途的连接要等下一个任务才丢掉，
    而记录失败、安排重试恰恰发生在同一个任务里，所以任务开始前与记录失败前都调用这里。
    """
    if connection.in_atomic_block:
        # 在调用方的事务里同步执行（测试、manage.py reindex）：换连接会丢掉那个事务，这里什么都不做
        return
    close_old_connections()
    deadline = time.monotonic() + wait_seconds
    pause = 1.0
    while True:
        try:
            if connection.connection is not None and not connection.is_usable():
                connection.close()
            connection.ensure_connection()
            return
        except DatabaseError:
            connection.close()
            if time.monotonic() + pause > deadline:
                raise
            logger.warning("database_unreachable_waiting", retry_in_s=pause)
            time.sleep(pause)
            pause = min(pause * 2, 8.0)


def schedule_task(func: str, object_id: str, *, attempt: int, delay_seconds: float, request_id: str,
                  label: str, queue: str | None = None, timeout: int | None = None) -> datetime:
    """安排 ``func(object_id, attempt=attempt, request_id=...)`` 在 delay 秒后执行（放进 queue 对应的
    django-q2 集群，默认主队列），返回执行时间。``timeout`` 是这次执行的秒数上限（默认集群的 ``timeout``），
    按 django-q2 的约定放在 kwargs 的 ``q_options`` 里，调度器入队时取出，不会传给 func。"""
    # django_q 的模型只能在应用注册表就绪之后导入，而管道层更早就会被导入：在调用时导入
    from django_q.models import Schedule

    kwargs: dict[str, Any] = {"attempt": attempt, "request_id": request_id}
    if timeout is not None:
        kwargs["q_options"] = {"timeout": timeout}
    next_run = timezone.now() + timedelta(seconds=delay_seconds)
    Schedule.objects.create(
        name=f"{label}:{object_id}:{attempt}:{next_run.timestamp():.0f}",
        func=func,
        args=repr((object_id,)),
        kwargs=repr(kwargs),
        schedule_type=Schedule.ONCE,
        repeats=-1,
        next_run=next_run,
        cluster=queue,
    )
    return next_run
