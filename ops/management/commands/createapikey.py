"""manage.py createapikey：命令行创建 API key，明文只打印这一次。"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from knowledge.models import KnowledgeBase
from knowledge.selectors import parse_uuid
from ops.models import ApiKey


class Command(BaseCommand):
    help = "创建 API key 并打印明文（只显示一次）。默认读写、可访问全部知识库。"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="key 的名称（唯一），如调用方应用名")
        parser.add_argument("--read-only", action="store_true", help="只读：只能检索与查询，不能写入")
        parser.add_argument("--kb", action="append", default=[], metavar="KB_ID",
                            help="限定可访问的知识库 id，可重复；不给则可访问全部知识库")
        parser.add_argument("--quiet", action="store_true", help="只输出密钥本身（便于脚本捕获）")

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        if ApiKey.objects.filter(name=name).exists():
            raise CommandError(f"API key named {name!r} already exists")
        kb_ids = options["kb"]
        parsed = [parse_uuid(kb_id) for kb_id in kb_ids]
        knowledge_bases = list(KnowledgeBase.objects.filter(pk__in=[p for p in parsed if p]))
        found = {str(kb.pk) for kb in knowledge_bases}
        missing = sorted(kb_id for kb_id, p in zip(kb_ids, parsed, strict=True) if str(p) not in found)
        if missing:
            raise CommandError(f"unknown knowledge base id(s): {', '.join(missing)}")
        key = ApiKey(
            name=name,
            access=ApiKey.Access.READ if options["read_only"] else ApiKey.Access.READ_WRITE,
            all_knowledge_bases=not kb_ids,
        )
        raw = key.set_new_key()
        key.save()
        key.knowledge_bases.set(knowledge_bases)
        if options["quiet"]:
            self.stdout.write(raw)
            return
        scope = "all knowledge bases" if not kb_ids else ", ".join(kb_ids)
        self.stdout.write(self.style.SUCCESS(f"Created API key {name!r} ({key.get_access_display()}; {scope})"))
        self.stdout.write(raw)
        self.stdout.write("只显示这一次，请妥善保存。用法：Authorization: Bearer <key>")
