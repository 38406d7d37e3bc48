"""manage.py embeddeddb：查看、启动或停止内嵌 PostgreSQL（仅在未设置 RAG_DATABASE_URL 时使用）。

status 与 stop 只读 postmaster.pid，绝不为了回答问题而启动服务器。
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from infra.embedded_backend.base import DATA_DIR_KEY
from infra.embedded_db import (
    EmbeddedStatus,
    embedded_database_status,
    ensure_embedded_database,
    stop_embedded_database,
)


class Command(BaseCommand):
    help = "内嵌 PostgreSQL：status 显示运行状态、数据目录与端口，start 启动，stop 停止。"
    # 系统检查不需要数据库，但也没有必要：这个命令要在数据库停着时也能秒回
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["status", "start", "stop"])

    def handle(self, *args: Any, **options: Any) -> None:
        db = settings.DATABASES["default"]
        if DATA_DIR_KEY not in db:
            self.stdout.write(f"已设置 RAG_DATABASE_URL（{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/"
                              f"{db['NAME']}），不使用内嵌 PostgreSQL")
            return
        data_dir = Path(str(db[DATA_DIR_KEY]))
        action = options["action"]
        if action == "stop":
            stopped = stop_embedded_database(data_dir)
            state = "已停止" if stopped else "内嵌 PostgreSQL 未在运行，无需停止"
            self.stdout.write(f"{state}（数据目录 {data_dir / 'pgdata'}）")
            return
        if action == "start":
            ensure_embedded_database(data_dir, shared_buffers_mb=settings.EMBEDDED_SHARED_BUFFERS_MB)
        self.stdout.write(self._describe(embedded_database_status(data_dir)))

    @staticmethod
    def _describe(status: EmbeddedStatus) -> str:
        if not status.running:
            return (f"内嵌 PostgreSQL：已停止\n  数据目录：{status.data_dir}\n"
                    "  下一个需要数据库的命令（serve、migrate、qcluster……）会自动启动它")
        return (f"内嵌 PostgreSQL：运行中（pid {status.pid}）\n  数据目录：{status.data_dir}\n"
                f"  端口：{status.port}（只监听 Unix socket，目录 {status.socket_dir}）\n"
                "  它独立于服务进程运行，停止服务后仍在；用 embeddeddb stop 停止")
