"""``manage.py compact_fulltext``：把全文引擎 L0 里的分块合并成段（全部知识库，或 ``--kb`` 指定的一个）。

平时由写入后入队的任务与每分钟的定时任务做（``ops.tasks.compact_fulltext``）；升级到 v2 引擎的迁移把已有分块
全部放进 L0，这个命令把它们转成段并显示进度。每批（``RAG_FULLTEXT_COMPACT_BATCH`` 个分块）一个事务：
中断（Ctrl-C、SIGTERM、断电）后再运行，从剩下的接着做，已提交的批不会重做；检索在整个过程中照常可用。
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from knowledge.management.options import knowledge_base_option
from search import segments
from search.models import FulltextKbStats


class Command(BaseCommand):
    help = "把全文引擎 L0 里的分块合并成段（全部知识库，或 --kb 指定的一个），显示进度，可中断后续做。"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kb", metavar="KB", help="知识库 id 或名称（默认全部）")
        parser.add_argument("--merge", action="store_true",
                            help="合并完再把每个知识库的段并成少数几个大段（大批写入之后：词典几乎减半，查询少查几个段）")

    def handle(self, *args: Any, **options: Any) -> None:
        kb_filter = None
        if options["kb"]:
            kb_filter = knowledge_base_option(options["kb"]).id
        with connection.cursor() as cursor:
            cursor.execute("SELECT knowledge_base_id, count(*) FROM fulltext_l0"
                           " WHERE %s::uuid IS NULL OR knowledge_base_id = %s GROUP BY 1 ORDER BY 2",
                           [kb_filter, kb_filter])
            pending = cursor.fetchall()
        if not pending and not options["merge"]:
            self.stdout.write("没有待合并的分块")
            return
        total = sum(int(count) for _, count in pending)
        if total:
            # 升级把已有分块一次放进了 L0，统计可能还是那之前的：取一批行的计划按它估，行数差几个数量级时会很慢
            # （见 search.segments.rebuild）
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE fulltext_l0")
        done, started = 0, time.monotonic()
        for kb_id, count in pending:
            self.stdout.write(f"知识库 {kb_id}：{count} 个分块待合并")
            while True:
                # 一批一个事务：每批之后报告进度，中断时已提交的批保留
                result = segments.compact(kb_id, batch=settings.FULLTEXT_COMPACT_BATCH, once=True)
                done += result.chunks
                elapsed = time.monotonic() - started
                self.stdout.write(f"  {done}/{total} 个分块（{done / max(elapsed, 1e-9):.0f} 个/s），"
                                  f"新段 {result.segments}，并掉 {result.merged} 段，清除已删 {result.purged}")
                if result.chunks < settings.FULLTEXT_COMPACT_BATCH:
                    break
        if options["merge"]:
            kbs = [kb_filter] if kb_filter else FulltextKbStats.objects.values_list("knowledge_base_id", flat=True)
            rewritten = False
            for kb_id in list(kbs):
                merged = segments.merge_all(kb_id)
                rewritten = rewritten or merged.merged > 0
                self.stdout.write(f"知识库 {kb_id}：{merged.merged} 个段并成 {merged.segments} 个，"
                                  f"清除已删 {merged.purged}")
            # 并段留下的空页还给文件系统（与定时维护相同）
            repacked = segments.repack_tables() if rewritten else []
            if repacked:
                self.stdout.write(f"重写紧凑：{', '.join(repacked)}")
        # 升级时全部分块都经过 L0：合并完把停在高峰的索引（L0 的 GIN 首当其冲）重建回去
        segments.shrink_indexes()
        self.stdout.write(f"完成：{done} 个分块，用时 {time.monotonic() - started:.1f} s")
