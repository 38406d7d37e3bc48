"""PostgreSQL 后端：在 django_prometheus 的包装之上，刚刚无错用完的连接跳过下一次健康检查。

Django 的 ``CONN_HEALTH_CHECKS`` 在每个请求（以及检索线程池的每个任务）第一次用连接时先发一条 ``SELECT 1``：
数据库重启、故障切换、空闲连接被中间设备掐断之后，换一条新连接，请求不会因此失败。代价是每个请求、每条连接
一次往返——检索请求用两条连接（请求线程与向量路线程），剖析 2 核机器上的 ``/search`` 时，这条 ``SELECT 1``
单独占了请求线程样本的 16%（``bench/README.md``）。

上一次用这条连接的请求（或线程池任务）没有出错、结束还不到 ``RAG_DB_HEALTH_CHECK_WINDOW_MS``（默认 500 ms，
与 HikariCP 连接池的 ``aliveBypassWindowMs`` 相同）时，连接刚刚完成过查询，再证明一次的意义很小：跳过。
空闲更久的连接照常检查——断连多半发生在空闲期间。窗口设为 0 即每次都检查（Django 的原样行为）。
"""

from __future__ import annotations

import time

from django.conf import settings
from django_prometheus.db.backends.postgresql.base import DatabaseWrapper as PrometheusDatabaseWrapper


class DatabaseWrapper(PrometheusDatabaseWrapper):
    """django_prometheus 的 PostgreSQL 后端，加上按“最近一次无错用完”跳过的健康检查。"""

    health_check_done: bool  # Django 在 __init__ 里设置；这里声明类型给 mypy
    # 这条连接上一次在本轮（请求或线程池任务）里被用过、且没有出错地结束的时刻（time.monotonic()）
    _proven_at: float | None = None

    def connect(self) -> None:
        super().connect()
        self._proven_at = None

    def close_if_unusable_or_obsolete(self) -> None:
        # 请求开始与结束都会调用这里。调用前 health_check_done 为真说明本轮用过这条连接（拿游标时检查过或跳过了
        # 检查）：只有“用过且没出错”的那一次结束才记为证明，请求开始时的调用不会把空闲了很久的连接当成刚用过。
        # 出过错的一轮，Django 在这里自己发 SELECT 1，通过后把 health_check_done 置真：那也是刚刚的证明
        used_cleanly = self.connection is not None and self.health_check_done and not self.errors_occurred
        super().close_if_unusable_or_obsolete()
        if self.connection is None:
            self._proven_at = None
        elif used_cleanly or self.health_check_done:
            self._proven_at = time.monotonic()

    def close_if_health_check_failed(self) -> None:
        proven_at = self._proven_at
        if (self.connection is not None and not self.health_check_done and proven_at is not None
                and time.monotonic() - proven_at < settings.DB_HEALTH_CHECK_WINDOW_MS / 1000):
            self.health_check_done = True
            return
        super().close_if_health_check_failed()
