"""manage.py import_knowledge DIR --kb NAME：把目录里的 JSON 知识文件（每个文件一个 domain）同步进知识库。

文件格式::

    {"domain": "python", "version": 3,
     "items": [{"id": "py-001", "title": "…", "content": "…", "category": "…", "tags": ["…"], "metadata": {}}]}

每个 domain 的版本号与内容摘要记在数据库里：都没变就跳过；变了就逐条同步（没变的条目不做任何工作），
并删除文件里已不存在的条目。``--dry-run`` 只打印会发生什么。

输出给人看：stdout 是进度条与中文汇总，info 级的结构化日志在运行期间不输出（警告与错误写到 stderr），
``-v 2`` 时照常输出全部日志。

第一个要写入（新建或更新）的 domain 之前先加载知识库的 embedding 模型（文档批量引擎、分块 tokenizer、全文词典）
并打印一行用时：模型加载不算进第一个条目，进度条也不会在第一条上停住半分钟。全部跳过的导入不加载模型。
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from documents import items as item_services
from documents.api.item_serializers import ItemEntrySerializer, item_input
from documents.domains import DomainSyncStats, domain_sync
from documents.items import ItemInput
from infra.embedders import embedder_warm_up
from infra.logging import command_output
from infra.principal import SYSTEM_PRINCIPAL
from infra.progress import graceful_stop, write_progress
from knowledge.models import KnowledgeBase
from knowledge.selectors import parse_uuid
from knowledge.services import knowledge_base_create

# 合计的各项（DomainSyncStats 的字段）与汇总里的中文说法
_TOTALS = {"created": "新建", "updated": "更新", "unchanged": "未变", "queued": "排队", "removed": "删除",
           "failed": "失败", "chunks_embedded": "向量化分块", "chunks_reused": "复用向量的分块"}


class DomainFileError(Exception):
    """知识文件不合法：消息指明文件与原因。"""


def load_domain_file(path: Path) -> tuple[str, str, list[ItemInput], list[tuple[str, str]]]:
    """读一个知识文件，返回 (domain, 版本, 合法条目, 不合法条目的 (外部 id, 原因))。"""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DomainFileError(f"{path.name}：无法读取 JSON（{exc}）") from exc
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise DomainFileError(f"{path.name}：应是一个含 domain、version 与 items 数组的 JSON 对象")
    domain = str(data.get("domain") or path.stem)
    if "version" not in data:
        raise DomainFileError(f"{path.name}：缺少 version")
    items: list[ItemInput] = []
    invalid: list[tuple[str, str]] = []
    for index, raw in enumerate(data["items"]):
        if isinstance(raw, dict) and "id" in raw and "external_id" not in raw:
            raw = {"external_id": str(raw["id"]), **{k: v for k, v in raw.items() if k not in ("id", "domain")}}
        elif isinstance(raw, dict):
            raw = {k: v for k, v in raw.items() if k != "domain"}
        entry = ItemEntrySerializer(data=raw)
        if entry.is_valid():
            items.append(item_input(entry.validated_data))
        else:
            external_id = str(raw.get("external_id") or f"#{index}") if isinstance(raw, dict) else f"#{index}"
            reason = json.dumps(entry.errors, ensure_ascii=False)
            invalid.append((external_id, f"{path.name} 里的条目不合法：{reason}"))
    return domain, str(data["version"]), items, invalid


class Command(BaseCommand):
    help = "把目录里的 JSON 知识文件（每个文件一个 domain）同步进知识库；版本与内容都没变的 domain 直接跳过。"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory", help="你存放 *.json 知识文件的文件夹（只读这一层的 *.json）")
        parser.add_argument("--kb", required=True, metavar="NAME", help="知识库名称或 id；名称不存在时新建")
        parser.add_argument("--dry-run", action="store_true", help="只打印会发生什么，不写入")

    def handle(self, *args: Any, **options: Any) -> None:
        directory = Path(options["directory"])
        if not directory.is_dir():
            raise CommandError(f"{directory} 不是一个文件夹：请给出存放 *.json 知识文件的文件夹")
        files = sorted(directory.glob("*.json"))
        if not files:
            raise CommandError(f"{directory} 里没有 *.json 知识文件（只读这一层，不进子文件夹）")
        # -v 2：结构化日志照常输出
        with command_output(self.stderr) if options["verbosity"] < 2 else nullcontext():
            self._run(files, options)

    def _run(self, files: list[Path], options: dict[str, Any]) -> None:
        kb = self._knowledge_base(options["kb"], create=not options["dry_run"])
        self._warm = False
        started = time.monotonic()
        totals = dict.fromkeys(_TOTALS, 0)
        problems = 0
        with graceful_stop() as stop:  # 当前 domain 做完再停
            for path in files:
                if stop.requested:
                    self.stderr.write("收到停止信号，已中止")
                    break
                try:
                    domain, version, items, invalid = load_domain_file(path)
                except DomainFileError as exc:
                    self.stderr.write(str(exc))
                    problems += 1
                    continue
                stats = (self._sync(kb, domain, version, items, options["dry_run"], invalid) if kb
                         else self._new_domain(domain, version, items, invalid))
                for key in _TOTALS:
                    totals[key] += getattr(stats, key)
                problems += stats.failed
        self.stdout.write(self._totals_line(totals, time.monotonic() - started, dry_run=options["dry_run"]))
        if problems:
            sys.exit(1)

    @staticmethod
    def _totals_line(totals: dict[str, int], seconds: float, *, dry_run: bool) -> str:
        """``合计：新建 5，更新 0，……；耗时 0.42 秒``；排队为 0 时不列出（只有大条目才会排队）。"""
        parts = [f"{label} {totals[key]}" for key, label in _TOTALS.items() if key != "queued" or totals[key]]
        return "合计：" + "，".join(parts) + f"；耗时 {seconds:.2f} 秒" + ("（试运行，未写入）" if dry_run else "")

    def _knowledge_base(self, name_or_id: str, *, create: bool) -> KnowledgeBase | None:
        parsed = parse_uuid(name_or_id)
        queryset = KnowledgeBase.objects.exclude(status=KnowledgeBase.Status.DELETED)
        kb = (queryset.filter(pk=parsed) if parsed else queryset.filter(name=name_or_id)).first()
        if kb is None and create:
            kb = knowledge_base_create(principal=SYSTEM_PRINCIPAL, name=name_or_id)
            self.stdout.write(f"新建知识库 {kb.name}（{kb.id}）")
        if kb is not None and not kb.is_enabled:
            raise CommandError(f"知识库 {kb.name} 是{kb.get_status_display()}状态，不能导入")
        return kb

    def _sync(self, kb: KnowledgeBase, domain: str, version: str, items: list[ItemInput], dry_run: bool,
              invalid: list[tuple[str, str]]) -> DomainSyncStats:
        started = time.monotonic()

        def progress(done: int, total: int) -> None:
            write_progress(self.stdout, done, total, started, "条")

        if not dry_run and not self._warm:
            self._warm_up(kb, domain, version, items, invalid)
        stats = domain_sync(kb=kb, domain=domain, version=version, items=items, dry_run=dry_run, progress=progress,
                            invalid=invalid)
        if not stats.skipped and not dry_run:
            self.stdout.write("")
        self.stdout.write(self._summary(stats))
        for failure in stats.failures:
            self.stderr.write(f"  {failure}")
        return stats

    def _warm_up(self, kb: KnowledgeBase, domain: str, version: str, items: list[ItemInput],
                 invalid: list[tuple[str, str]]) -> None:
        """这个 domain 有条目要新建或更新（先试运行一遍看看）时，在写第一个条目之前加载模型并打印用时。"""
        plan = domain_sync(kb=kb, domain=domain, version=version, items=items, dry_run=True, invalid=invalid)
        if plan.skipped or not (plan.created or plan.updated):
            return
        self._warm = True  # 只试一次：失败时各条目照常写入，失败的由写入本身报告
        started = time.monotonic()
        self.stdout.write(f"加载向量模型 {kb.embedding_provider}:{kb.embedding_model}（写入第一个条目之前）……",
                          ending="")
        self.stdout.flush()
        try:
            # 与条目写入取同一个提供方（documents.items.embedder）
            embedder_warm_up(item_services.embedder(kb.embedding_provider, kb.embedding_model), documents=True)
        except Exception as exc:
            self.stdout.write("没能加载")
            self.stderr.write(f"向量模型没能预先加载（{type(exc).__name__}: {exc}），照常逐条写入")
            return
        self.stdout.write(f"用时 {time.monotonic() - started:.2f} 秒")

    def _new_domain(self, domain: str, version: str, items: list[ItemInput],
                    invalid: list[tuple[str, str]]) -> DomainSyncStats:
        """--dry-run 且知识库还不存在：合法条目都会新建。"""
        stats = DomainSyncStats(domain=domain, version=version, dry_run=True, created=len(items), failed=len(invalid),
                                failures=tuple(f"{external_id}: {reason}" for external_id, reason in invalid))
        self.stdout.write(self._summary(stats))
        for failure in stats.failures:
            self.stderr.write(f"  {failure}")
        return stats

    @staticmethod
    def _summary(stats: DomainSyncStats) -> str:
        if stats.skipped:
            return f"{stats.domain} v{stats.version}：版本与内容未变，跳过（{stats.unchanged} 条）"
        prefix = "（试运行）" if stats.dry_run else ""
        queued = f"，排队 {stats.queued}" if stats.queued else ""
        line = (f"{prefix}{stats.domain} v{stats.version}：新建 {stats.created}，更新 {stats.updated}，"
                f"未变 {stats.unchanged}{queued}，删除 {stats.removed}，失败 {stats.failed}")
        if not stats.dry_run:
            line += (f"；向量化分块 {stats.chunks_embedded}、复用向量的分块 {stats.chunks_reused}；"
                     f"{stats.seconds:.2f} 秒")
        return line
