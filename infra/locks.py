"""PostgreSQL 会话级 advisory lock。

用来保证同一个后台任务同一时刻只有一个执行者（代理重投递、自动重试、孤儿回收都可能
让同一任务被多次入队）。锁绑定在数据库连接上：持有它的 worker 被杀后连接断开，锁自动释放，
因此“能拿到锁”就等价于“没有活着的执行者”——但数据库重启同样会释放它，这时执行者可能还活着。
需要跨数据库重启仍然成立的互斥（文档摄取）用写在行里的租约（``row_lease``）。
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import structlog
from django.db import DatabaseError, connection, models
from django.db.models import ExpressionWrapper, Q
from django.db.models.functions import Now

logger = structlog.get_logger(__name__)


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


@dataclass
class Lease:
    """一行任务记录上的租约：持有者令牌写在行里，到期前由后台线程续期。

    与 advisory lock 不同，租约不随连接消失：数据库重启后，仍活着的 worker 照样持有它，回收器不会把
    同一文档再交给别人；worker 真的死了，租约到期不续，回收器才接手。``lost`` 置位表示租约已被
    回收器收回，执行者应尽快放弃，提交时的令牌核对兜底。
    """

    model: type[models.Model]
    pk: Any
    token: str
    ttl: int
    lost: threading.Event = field(default_factory=threading.Event)

    def rows(self) -> models.QuerySet[Any]:
        """仍由本租约持有的那一行（空查询集即租约已失）。"""
        return self.model._default_manager.filter(pk=self.pk, lease_owner=self.token)

    def renew(self) -> bool:
        renewed = self.rows().update(lease_expires_at=_expiry(self.ttl))
        if not renewed:
            self.lost.set()
        return bool(renewed)


def _expiry(ttl: int) -> Any:
    # 用数据库时钟：多台机器上的 worker 与回收器比较的是同一个“现在”
    return ExpressionWrapper(Now() + timedelta(seconds=ttl), output_field=models.DateTimeField())


def _keep_renewed(lease: Lease, stop: threading.Event) -> None:
    """续期线程：每 1/4 租期续一次；数据库暂时连不上就换新连接继续试，租约被收回则退出。"""
    try:
        while not stop.wait(lease.ttl / 4):
            try:
                if not lease.renew():
                    logger.warning("lease_lost", pk=str(lease.pk))
                    return
            except DatabaseError:
                logger.warning("lease_renew_failed", pk=str(lease.pk), exc_info=True)
                connection.close()
    finally:
        # 线程自己的连接：不关就一直占着数据库的一个会话
        connection.close()


@contextmanager
def row_lease(model: type[models.Model], pk: Any, *, ttl: int, renew_in_background: bool = True,
              ) -> Iterator[Lease | None]:
    """取得一行的租约（行上没有持有者或租约已过期才能取得），产出 Lease 或 None；退出时归还。

    ``renew_in_background=False`` 用于在调用方进程内同步执行的任务（测试、调试）：续期线程用的是自己的
    连接，看不到调用方尚未提交的事务；同步执行时也不存在会来接手的其他 worker。
    """
    token = uuid.uuid4().hex
    taken = model._default_manager.filter(pk=pk).filter(
        Q(lease_owner="") | Q(lease_expires_at__lt=Now())
    ).update(lease_owner=token, lease_expires_at=_expiry(ttl))
    if not taken:
        yield None
        return
    lease = Lease(model=model, pk=pk, token=token, ttl=ttl)
    stop = threading.Event()
    keeper = threading.Thread(target=_keep_renewed, args=(lease, stop), daemon=True, name=f"lease-{pk}")
    if renew_in_background:
        keeper.start()
    try:
        yield lease
    finally:
        stop.set()
        if keeper.is_alive():
            keeper.join()
        # 归还失败（数据库又断了）也无妨：租约到期后回收器会接手
        try:
            lease.rows().update(lease_owner="", lease_expires_at=None)
        except DatabaseError:
            logger.warning("lease_release_failed", pk=str(pk), exc_info=True)
