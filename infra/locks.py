"""PostgreSQL 会话级 advisory lock。

用来保证同一件维护工作同一时刻只有一个执行者（同一知识库的 HNSW 建图、相关概率模型拟合：定时任务可能在上一轮
还没做完时又被调度）。锁绑定在数据库连接上：持有它的 worker 被杀后连接断开，锁自动释放，因此“能拿到锁”就等价于
“没有活着的执行者”——但数据库重启同样会释放它，这时执行者可能还活着。需要跨数据库重启仍然成立的互斥
（后台作业：摄取、清理）用写在作业行里的租约（``jobs.runner``）。
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
