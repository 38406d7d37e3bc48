"""PostgreSQL 会话级 advisory lock。

用来保证同一个后台任务同一时刻只有一个执行者（代理重投递、自动重试、孤儿回收都可能
让同一任务被多次入队）。锁绑定在数据库连接上：持有它的 worker 被杀后连接断开，锁自动释放，
因此“能拿到锁”就等价于“没有活着的执行者”。
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


@contextmanager
def advisory_lock(key: str) -> Iterator[bool]:
    """尝试获取以字符串为键的锁；产出是否拿到，退出时释放。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", [key])
        acquired = bool(cursor.fetchone()[0])
    try:
        yield acquired
    finally:
        if acquired:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [key])


@contextmanager
def any_advisory_lock(keys: list[str]) -> Iterator[str | None]:
    """在一组锁中拿第一把空闲的（信号量）；全忙则产出 None。"""
    for key in keys:
        with advisory_lock(key) as acquired:
            if acquired:
                yield key
                return
    yield None


def is_locked(key: str) -> bool:
    """探测锁当前是否被别的会话持有（拿到就立即释放）。"""
    with advisory_lock(key) as acquired:
        return not acquired
