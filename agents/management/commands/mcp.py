"""manage.py mcp：以 stdio 提供 MCP 工具（供 Claude Desktop、Cursor 等本地 Agent 启动）。

开始服务之前先加载检索要用的模型（查询引擎、全文词典、重排序；key 能写时连同文档批量引擎，upsert_knowledge_item
在本进程里同步 embedding），第一次 search_knowledge 因此不必替大家等加载：外部探测里它用了 72 秒，而不少 MCP 宿主
60 秒就放弃一次工具调用。本机没有的重排序模型不在启动时下载（见 :mod:`ops.warmup`）。
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.stdio import serve_stdio
from infra.principal import SYSTEM_PRINCIPAL
from ops.auth import principal_for_key
from ops.warmup import load_models


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
        # 提示也写 stderr（MCP 宿主把它记进自己的日志）；只读 key 用不到文档批量引擎
        self.stderr.write("ragservice MCP：正在加载检索要用的模型……")
        state = load_models(ocr=False, rerank=True, documents=principal.can_write)
        if state.ok:
            self.stderr.write(f"ragservice MCP：已加载 {state.loaded}（{state.seconds:.1f} 秒），开始在 stdio 上服务")
        else:
            self.stderr.write(f"ragservice MCP：模型没能加载（{state.error}，见上面的日志），第一次用到时再试；"
                              "开始在 stdio 上服务")
        serve_stdio(principal)
