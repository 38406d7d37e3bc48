"""manage.py embeddeddb：查看或停止内嵌 PostgreSQL（仅在未设置 RAG_DATABASE_URL 时使用）。"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from ragservice.embedded_db import stop_embedded_database


class Command(BaseCommand):
    help = "内嵌 PostgreSQL：status 显示连接地址，stop 停止服务器。"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["status", "stop"])

    def handle(self, *args: Any, **options: Any) -> None:
        data_dir = Path(settings.DATA_DIR)
        if options["action"] == "stop":
            stopped = stop_embedded_database(data_dir)
            self.stdout.write("已停止" if stopped else "内嵌 PostgreSQL 未在运行")
            return
        db = settings.DATABASES["default"]
        self.stdout.write(f"数据库：{db['NAME']} @ {db['HOST'] or 'localhost'}:{db['PORT'] or 5432}")
