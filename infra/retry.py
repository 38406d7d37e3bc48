"""后台任务的退避时长，以及任务开始前、记录失败前的数据库重连：数据库重启后 worker 手里的连接全是死的。"""

from __future__ import annotations

import time

import structlog
from django.db import DatabaseError, close_old_connections, connection

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
