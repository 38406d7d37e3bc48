"""manage.py reindex：在当前进程内重新索引一个文档或整个知识库，显示进度。"""

from __future__ import annotations

import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from documents import services
from documents.models import Document
from infra.context import task_context
from infra.errors import ApplicationError
from infra.principal import SYSTEM_PRINCIPAL
from infra.progress import graceful_stop, write_progress
from jobs.runner import run_job
from knowledge.management.options import knowledge_base_option


class Command(BaseCommand):
    help = "重新索引文档（--document）或知识库下全部已完成/失败的文档（--kb）；旧分块在新分块提交前保持可检索。"

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--kb", metavar="KB", help="知识库名称或 id")
        target.add_argument("--document", metavar="DOCUMENT_ID", help="文档 id")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["document"]:
            ids = [options["document"]]
        else:
            kb = knowledge_base_option(options["kb"])
            ids = list(Document.objects.filter(
                knowledge_base=kb, status__in=[Document.Status.COMPLETED, Document.Status.FAILED]
            ).order_by("created_at").values_list("id", flat=True))
            if not ids:
                raise CommandError(f"no completed or failed documents in knowledge base {kb.name!r}")
        failures = 0
        started = time.monotonic()
        with graceful_stop() as stop:  # 当前文档做完再停，不留半截状态
            for done, document_id in enumerate(ids, start=1):
                if stop.requested:
                    self.stderr.write("收到停止信号，已中止")
                    break
                failures += not self._reindex_one(str(document_id))
                write_progress(self.stdout, done, len(ids), started, "文档")
        self.stdout.write("")
        self.stdout.write(f"完成：{len(ids) - failures} 成功，{failures} 失败")
        if failures:
            sys.exit(1)

    def _reindex_one(self, document_id: str) -> bool:
        try:
            job = services.document_reindex(principal=SYSTEM_PRINCIPAL, document_id=document_id, queue=False).job
        except ApplicationError as exc:
            self.stderr.write(f"\n{document_id}: {exc.message}")
            return False
        assert job is not None
        with task_context("reindex-command", None, document_id=document_id):
            # 作业没交给队列（queue=False）：在本进程里执行它；暂时性失败照常由作业执行器安排到队列里重试
            run_job(str(job.id))
        document = Document.objects.get(pk=document_id)
        ok = document.status == Document.Status.COMPLETED and not document.reindex_status
        if not ok:
            self.stderr.write(f"\n{document.filename}: {document.error_message}")
        return ok
