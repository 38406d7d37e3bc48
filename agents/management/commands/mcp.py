"""manage.py mcp：以 stdio 提供 MCP 工具（供 Claude Desktop、Cursor 等本地 Agent 启动）。"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.stdio import serve_stdio
from infra.principal import SYSTEM_PRINCIPAL
from ops.auth import principal_for_key


class Command(BaseCommand):
    help = "以 stdio 提供 MCP 工具；--api-key（或环境变量 RAG_API_KEY）限定为该 key 的知识库作用域与权限。"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--api-key", default=os.environ.get("RAG_API_KEY", ""),
                            help="API key；不给则以本机管理员身份运行（可访问全部知识库）")

    def handle(self, *args: Any, **options: Any) -> None:
        principal = SYSTEM_PRINCIPAL
        if options["api_key"]:
            found = principal_for_key(options["api_key"])
            if found is None:
                raise CommandError("invalid or revoked API key")
            principal = found
        # stdout 是协议通道：把日志（默认写 stdout）改写到 stderr
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(sys.stderr)
        serve_stdio(principal)
