"""``manage.py rebuild_fulltext``：改了全文切词设置（``RAG_FULLTEXT_ANALYZER``）后，按新设置对分块的原文重新切词、
重新登记进全文引擎。

经全文引擎的 ``index``（:func:`search.retrieval.fulltext_engine`）：不重新解析、不重新向量化；
PostgreSQL 实现分批 UPDATE（带上新的 tsvector，过渡列），触发器在同一事务里把分块撤出、换进 L0，最后合并成段；
检索在重算期间照常可用（同一知识库里新旧切法的分块会短暂并存，重算完即一致）。
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from knowledge.management.options import knowledge_base_option
from knowledge.models import KnowledgeBase
from search.retrieval import fulltext_engine


class Command(BaseCommand):
    help = "按当前 RAG_FULLTEXT_ANALYZER 重算分块的全文索引（全部知识库，或 --kb 指定的一个）。"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kb", metavar="KB", help="知识库 id 或名称（默认全部）")

    def handle(self, *args: Any, **options: Any) -> None:
        kb_id = None
        if options["kb"]:
            kb_id = knowledge_base_option(options["kb"]).id
        started = time.monotonic()
        engine = fulltext_engine()
        count = engine.index(kb_id=kb_id)
        # 重算过的分块进了 L0（旧的序号进了删除集）：马上合并成段，不等定时任务
        kbs = [kb_id] if kb_id else list(KnowledgeBase.objects.values_list("id", flat=True))
        for each in kbs:
            engine.compact(each)
        self.stdout.write(f"已按 {settings.FULLTEXT_ANALYZER} 切法重算 {count} 个分块的全文索引，"
                          f"用时 {time.monotonic() - started:.1f} s")
