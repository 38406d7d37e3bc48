"""``manage.py flush_ann_pending``：把还没进图的分块插进知识库自己的 HNSW 图（全部知识库，或 ``--kb`` 指定的一个）。

平时由写入后入队的任务与每分钟的定时任务做（``ops.tasks.flush_vector_pending``）。批量导入大库时临时调大了
``RAG_ANN_PENDING_MAX_CHUNKS``、或快队列的 worker 停过一阵，导完可以用这个命令立刻插完并看到进度，不必等定时任务。
每批一个事务（``search.ann.flush_pending``）：中断后再运行，从剩下的接着做；写入与检索在整个过程中照常。
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from knowledge.management.options import knowledge_base_option
from search.ann import flush_pending


class Command(BaseCommand):
    help = "把还没进图的分块插进知识库自己的 HNSW 图（全部知识库，或 --kb 指定的一个），可中断后续做。"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kb", metavar="KB", help="知识库 id 或名称（默认全部）")

    def handle(self, *args: Any, **options: Any) -> None:
        kb_filter = knowledge_base_option(options["kb"]).id if options["kb"] else None
        with connection.cursor() as cursor:
            cursor.execute("SELECT knowledge_base_id, count(*) FROM document_chunks WHERE ann_pending"
                           " AND (%s::uuid IS NULL OR knowledge_base_id = %s) GROUP BY 1 ORDER BY 2",
                           [kb_filter, kb_filter])
            pending = cursor.fetchall()
        if not pending:
            self.stdout.write("没有还没进图的分块")
            return
        for kb_id, count in pending:
            started = time.monotonic()
            flushed = flush_pending(kb_id=kb_id)
            elapsed = max(time.monotonic() - started, 1e-9)
            self.stdout.write(f"知识库 {kb_id}：{count} 个分块待进图，插了 {flushed} 个"
                              f"（{flushed / elapsed:.0f} 个/s）")
