"""manage.py ragconfig：列出全部 RAG_* 配置项及当前取值（--markdown 输出 README 用的表格）。"""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from infra.config import VARIABLES


class Command(BaseCommand):
    help = "列出所有 RAG_* 环境变量、类型、默认值与说明。"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--markdown", action="store_true", help="输出 Markdown 表格")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = sorted(VARIABLES.values(), key=lambda v: v.name)
        if options["markdown"]:
            self.stdout.write("| 变量 | 类型 | 默认值 | 说明 |\n|---|---|---|---|")
            for var in rows:
                default = "（未设置）" if var.default in (None, "") else f"`{var.default}`"
                self.stdout.write(f"| `{var.name}` | {var.kind} | {default} | {var.help} |")
            return
        for var in rows:
            current = os.environ.get(var.name, "")
            if var.kind == "secret" and current:
                current = "<secret>"
            self.stdout.write(f"{var.name}={current}  # 默认 {var.default!r}：{var.help}")
