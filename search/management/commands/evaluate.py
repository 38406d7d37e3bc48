"""``manage.py evaluate DATASET_DIR``：经真实摄取与检索路径评测 BEIR 格式数据集的检索质量。"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from documents.chunking import STRATEGY_DEFAULTS
from knowledge.models import KnowledgeBase
from knowledge.selectors import parse_uuid
from search.evaluation.dataset import DatasetError, load_dataset
from search.evaluation.runner import MODES, EvaluationConfig, run_evaluation


def _progress(items: Sequence[Any], description: str) -> Any:
    return tqdm(items, desc=description, unit="条", file=sys.stderr, dynamic_ncols=True)


class Command(BaseCommand):
    help = (
        "评测检索质量：把 BEIR 格式数据集（corpus.jsonl、queries.jsonl、qrels.tsv，可选 documents.jsonl 与 "
        "qrels_doc.tsv）经真实上传与摄取写入新知识库，对每种检索方式跑全部问题，输出 nDCG@10、Recall@10/100、"
        "MRR@10、answer-hit@1/5/10 与检索延迟。"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("dataset", type=Path, help="BEIR 格式数据集目录")
        parser.add_argument("--level", choices=("passage", "document"), default="passage",
                            help="passage：每个段落一份文档；document：整篇文档由服务分块（默认 passage）")
        parser.add_argument("--documents", type=Path, help="覆盖被摄取的文件（默认 corpus.jsonl / documents.jsonl）")
        parser.add_argument("--queries", type=Path, help="覆盖 queries.jsonl")
        parser.add_argument("--qrels", type=Path, help="覆盖 qrels.tsv / qrels_doc.tsv")
        parser.add_argument("--chunking", choices=sorted(STRATEGY_DEFAULTS), default="token", help="分块策略")
        parser.add_argument("--embedding-provider", help="embedding 提供方（默认 RAG_EMBEDDING_PROVIDER）")
        parser.add_argument("--embedding-model", help="embedding 模型（默认该提供方的默认模型）")
        parser.add_argument("--modes", default=",".join(MODES),
                            help=f"逗号分隔的检索方式，可选 {', '.join(MODES)}（默认全部）")
        parser.add_argument("--limit", type=int, help="只取按 id 排序的前 N 个问题")
        parser.add_argument("--output", type=Path, help="把完整结果写成 JSON 文件")
        parser.add_argument("--keep", action="store_true", help="评测后保留知识库（默认删除）")
        parser.add_argument("--reuse-kb", help="复用 --keep 留下的知识库（名称或 id），跳过摄取")
        parser.add_argument("--no-progress", action="store_true", help="不显示进度条")

    def handle(self, *args: Any, **options: Any) -> None:
        modes = tuple(m.strip() for m in options["modes"].split(",") if m.strip())
        unknown = [m for m in modes if m not in MODES]
        if unknown or not modes:
            raise CommandError(f"unknown mode(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(MODES)}")
        if options["limit"] is not None and options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        try:
            dataset = load_dataset(options["dataset"], options["level"], documents=options["documents"],
                                   queries=options["queries"], qrels=options["qrels"], limit=options["limit"])
        except DatasetError as exc:
            raise CommandError(str(exc)) from exc
        kb = self._reused(options["reuse_kb"])
        config = EvaluationConfig(chunking=options["chunking"], embedding_provider=options["embedding_provider"],
                                  embedding_model=options["embedding_model"], modes=modes, keep=options["keep"])
        self.stderr.write(f"{dataset.name}：{len(dataset.units)} 个{'段落' if dataset.level == 'passage' else '文档'}，"
                          f"{len(dataset.queries)} 个问题，方式 {', '.join(modes)}")
        progress = (lambda items, _description: items) if options["no_progress"] else _progress
        report = run_evaluation(dataset, config, progress, kb=kb)
        if options["output"]:
            options["output"].parent.mkdir(parents=True, exist_ok=True)
            options["output"].write_text(json.dumps(report.as_dict(), ensure_ascii=False, indent=2) + "\n",
                                         encoding="utf-8")
        self.stdout.write(report.markdown())
        self.stdout.write(f"\n总用时 {report.total_seconds:.0f} s" + ("" if config.keep or kb else
                                                                   "（知识库已删除）"))

    @staticmethod
    def _reused(name_or_id: str | None) -> KnowledgeBase | None:
        if not name_or_id:
            return None
        kb = KnowledgeBase.objects.filter(name=name_or_id).first()
        if kb is None:
            parsed = parse_uuid(name_or_id)
            kb = KnowledgeBase.objects.filter(pk=parsed).first() if parsed else None
        if kb is None or not kb.is_enabled:
            raise CommandError(f"knowledge base {name_or_id!r} does not exist or is not enabled")
        return kb
