"""主库 + 只读副本：检索的读走副本，其余一切走主库。

检索的 SQL 是原生游标（``search.retrieval``），Django 的数据库路由管不到它，所以分两处：

- ``PrimaryReplicaRouter``（``DATABASE_ROUTERS``）：ORM 的读、写、迁移一律在主库。ORM 读也不放到副本，
  因为摄取、条目写入、清理在同一个事务里先读后写，副本的复制延迟会让它们读到旧数据。
- ``search_connection()``：检索的只读 SQL 用它取连接。配置了 ``RAG_DATABASE_REPLICA_URL`` 且副本连得上
  时返回副本，否则返回主库；副本连不上后 ``RAG_DATABASE_REPLICA_RETRY_SECONDS`` 内直接用主库，
  不让每个请求都等一次连接超时。
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
import structlog
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from infra.metrics import REPLICA_FALLBACKS

logger = structlog.get_logger("infra.routers")

REPLICA = "replica"

# 位置参数（%s）或命名参数（%(name)s）
_Params = Sequence[Any] | Mapping[str, Any]

_lock = threading.Lock()
_replica_down_until = 0.0


class PrimaryReplicaRouter:
    """ORM 全部走主库；副本只给 ``search_connection()`` 用，也不在副本上跑迁移。"""

    def db_for_read(self, model: type[Any], **hints: Any) -> str:
        return DEFAULT_DB_ALIAS

    def db_for_write(self, model: type[Any], **hints: Any) -> str:
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        # 副本与主库是同一份数据，跨别名的关联没有问题
        return True

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool:
        # 副本由流复制跟随主库的结构，自己不能（也不该）执行 DDL
        return db == DEFAULT_DB_ALIAS


def replica_configured() -> bool:
    return REPLICA in settings.DATABASES


def search_connection() -> BaseDatabaseWrapper:
    """检索的只读 SQL 该用的连接：副本可用时是副本，否则是主库（连接对象按线程各一份，与 ``connection`` 相同）。"""
    global _replica_down_until
    primary = connections[DEFAULT_DB_ALIAS]
    if not replica_configured() or time.monotonic() < _replica_down_until:
        return primary
    replica = connections[REPLICA]
    try:
        replica.ensure_connection()
    except DatabaseError as exc:
        with _lock:
            _replica_down_until = time.monotonic() + settings.REPLICA_RETRY_SECONDS
        REPLICA_FALLBACKS.inc()
        logger.warning("replica_unavailable", error=str(exc), retry_after_s=settings.REPLICA_RETRY_SECONDS)
        replica.close()
        return primary
    return replica


def reset_replica_state() -> None:
    """忘掉“副本不可用”的记录（测试与运维命令用），下一次检索重新尝试副本。"""
    global _replica_down_until
    with _lock:
        _replica_down_until = 0.0


def fetchall_prepared(conn: BaseDatabaseWrapper, sql: str, params: _Params, *,
                      binary: bool = False) -> list[tuple[Any, ...]]:
    """在 ``conn`` 当前的事务里（不在事务里时是一条自动提交的语句）执行一条查询：服务端绑定参数、预备语句，
    ``binary`` 时结果按二进制格式传回。给每个请求都要走的那几条语句用（鉴权、限流、检索计划与回表、全文一路）。

    Django 的游标在客户端把参数拼进 SQL，每次执行服务端都要重新解析、规划：全文一路的统计与回表两条语句各自的规划
    比执行还贵（约 0.06 与 0.10 ms）。这里用 psycopg 的服务端绑定游标并要求预备（``prepare=True``）：同一个连接上
    同一条 SQL 第一次执行时预备，之后只传参数，PostgreSQL 复用规划（bench/pages/fulltext_engine.md，“预备语句”）。
    参数要在 SQL 里写明类型（如 ``%s::int[]``）。连接设置 ``RAG_DB_PREPARED_STATEMENTS=false`` 时
    （事务模式的 PgBouncer 1.21 以前不认预备语句）不预备，其余照旧。

    bytea 在文本格式里是两倍长的十六进制：全文一路一次读上百个倒排块（约 100 KB），服务端编码、客户端解码占了那条
    语句四成的时间（0.61 → 0.37 ms），所以倒排块按二进制取。

    语句照样经过连接上的 ``execute_wrapper``（bench 的按语句计时靠它），错误照样转成 Django 的数据库异常；
    它不经过 Django 的调试游标与 django-prometheus 的游标：调试日志与语句计数里没有这些语句。
    """
    # 与 Django 的游标一样先做连接的健康检查（CONN_HEALTH_CHECKS：每个请求第一次用连接时）：鉴权这条语句是请求的
    # 第一条，数据库重启后不先检查，每个线程手里断掉的连接都要让一个请求失败一次才会被换掉
    conn.close_if_health_check_failed()
    conn.ensure_connection()

    def execute(sql: str, params: _Params, many: bool, context: dict[str, Any]) -> list[tuple[Any, ...]]:
        with conn.wrap_database_errors, psycopg.Cursor(conn.connection) as cursor:
            cursor.execute(sql, params, binary=binary, prepare=True)
            return cursor.fetchall()

    # 与 Django 的 CursorWrapper._execute_with_wrappers 同样的套法：先登记的包在最外层
    executor: Any = execute
    for wrapper in reversed(conn.execute_wrappers):
        executor = functools.partial(wrapper, executor)
    return executor(sql, params, False, {"connection": conn, "cursor": None})
