"""延迟启动内嵌 PostgreSQL 的数据库后端。

以前 settings.py 在导入时就启动内嵌服务器，于是 ``manage.py help``、``ragconfig``，甚至
``embeddeddb stop`` 都会先把它拉起来。这里把“确保服务器在运行并取得 socket 地址”推迟到第一次
建立连接：不连数据库的命令永远不会启动它。解析结果按进程缓存，并写回 settings_dict，
之后的连接（包括检索线程池里的连接）不再重复检查。
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.db.backends.postgresql.client import DatabaseClient as PostgresDatabaseClient

from infra.config import database_from_url
from infra.embedded_db import ensure_embedded_database
from infra.postgres_backend.base import DatabaseWrapper as PostgresDatabaseWrapper

# 设置项里记录数据目录的键（conftest 会改 settings.DATA_DIR，这里必须记住启动时的那个）
DATA_DIR_KEY = "EMBEDDED_DATA_DIR"
# 设置项里记录内嵌服务器 shared_buffers（MB，0 为自动）的键
SHARED_BUFFERS_KEY = "EMBEDDED_SHARED_BUFFERS_MB"
_ADDRESS_KEYS = ("USER", "PASSWORD", "HOST", "PORT")
_resolved: dict[str, dict[str, Any]] = {}
_lock = threading.Lock()


def resolve_address(data_dir: str, shared_buffers_mb: int = 0) -> dict[str, Any]:
    """确保内嵌服务器在运行，返回连接地址（USER/PASSWORD/HOST/PORT）；每个进程只真正检查一次。"""
    with _lock:
        if data_dir not in _resolved:
            parsed = database_from_url(ensure_embedded_database(Path(data_dir), shared_buffers_mb=shared_buffers_mb))
            _resolved[data_dir] = {key: parsed[key] for key in _ADDRESS_KEYS}
        return _resolved[data_dir]


def _resolve(settings_dict: dict[str, Any]) -> None:
    if not settings_dict.get("HOST"):
        settings_dict.update(resolve_address(settings_dict[DATA_DIR_KEY], settings_dict.get(SHARED_BUFFERS_KEY, 0)))


class DatabaseClient(PostgresDatabaseClient):
    """``manage.py dbshell`` 不经过 get_connection_params：先解析内嵌服务器的地址，再交给 psql。"""

    def runshell(self, parameters: Iterable[str]) -> None:
        _resolve(self.connection.settings_dict)
        super().runshell(parameters)


class DatabaseWrapper(PostgresDatabaseWrapper):
    """与项目的 PostgreSQL 后端（``infra.postgres_backend``）相同，只是连接参数在第一次连接时才解析。"""

    client_class = DatabaseClient

    def get_connection_params(self) -> dict[str, Any]:
        _resolve(self.settings_dict)
        return super().get_connection_params()  # type: ignore[no-any-return]
