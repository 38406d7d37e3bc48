"""``manage.py evaluate DATASET_DIR``：经真实摄取与检索路径评测 BEIR 格式数据集的检索质量。

``manage.py evaluate --sample`` 不需要任何数据：在临时目录里生成一个十几段的中文示例数据集
（:mod:`search.evaluation.sample`），照常评测，用完删除。

运行期间 info 级的结构化日志不输出（摄取每个文档都有好几行，会冲掉进度与报告），警告与错误写到 stderr；
``-v 2`` 时照常输出。
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from infra.embedders import locally_available
from infra.logging import command_output
from knowledge.models import KnowledgeBase
from knowledge.selectors import knowledge_base_by_name_or_id
from raglib.chunking import STRATEGY_DEFAULTS
from raglib.evaluation.calibration import suggest
from raglib.evaluation.dataset import DatasetError, Query, load_dataset, read_queries
from search.evaluation.runner import MODES, REFERENCE_MODE, EvaluationConfig, compare_reports, run_evaluation
from search.evaluation.sample import write_sample_dataset
from search.rerankers import configured_reranker

ALL_MODES = (*MODES, REFERENCE_MODE)


# 无关问题集每个最多取这么多条：看分数的分布，几百条足够
UNRELATED_LIMIT = 300
# --sample 生成的数据集目录名（也是报告与临时知识库名里的数据集名）
SAMPLE_NAME = "sample"


def _stage_lines(stream: Any) -> Any:
    """``--no-progress``：不画进度条（日志文件里不好看），但每个阶段开始、结束各打一行，长评测不会一小时没有输出。"""

    def progress(items: Sequence[Any], description: str) -> Iterator[Any]:
        stream.write(f"{description}：{len(items)} 项……")
        started = time.monotonic()
        yield from items
        stream.write(f"{description}：完成（{time.monotonic() - started:.0f} s）")

    return progress


def _progress(items: Sequence[Any], description: str) -> Any:
    return tqdm(items, desc=description, unit="条", file=sys.stderr, dynamic_ncols=True)


class Command(BaseCommand):
    help = (
        "评测检索质量：把 BEIR 格式数据集（corpus.jsonl、queries.jsonl、qrels.tsv，可选 documents.jsonl 与 "
        "qrels_doc.tsv）经真实上传与摄取写入新知识库，对每种检索方式跑全部问题，输出 nDCG@10、Recall@10/100、"
        "MRR@10、answer-hit@1/5/10 与检索延迟。"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("dataset", type=Path, nargs="?", help="BEIR 格式数据集目录（用 --sample 时不给）")
        parser.add_argument("--sample", action="store_true",
                            help="不用自己的数据：在临时目录里生成一个十几段的中文示例数据集并评测，看看报告长什么样")
        parser.add_argument("--level", choices=("passage", "document"), default="passage",
                            help="passage：每个段落一份文档；document：整篇文档由服务分块（默认 passage）")
        parser.add_argument("--documents", type=Path, help="覆盖被摄取的文件（默认 corpus.jsonl / documents.jsonl）")
        parser.add_argument("--queries", type=Path, help="覆盖 queries.jsonl")
        parser.add_argument("--qrels", type=Path, help="覆盖 qrels.tsv / qrels_doc.tsv")
        parser.add_argument("--chunking", choices=sorted(STRATEGY_DEFAULTS), default="token", help="分块策略")
        parser.add_argument("--embedding-provider", help="embedding 提供方（默认 RAG_EMBEDDING_PROVIDER）")
        parser.add_argument("--embedding-model", help="embedding 模型（默认该提供方的默认模型）")
        parser.add_argument("--modes",
                            help=f"逗号分隔的检索方式，可选 {', '.join(ALL_MODES)}（默认全部；{REFERENCE_MODE} 是"
                                 "在同一批分块上用 Python 算的教科书 BM25，作对照；--sample 时重排序模型不在本机则"
                                 "默认不跑 hybrid+rerank）")
        parser.add_argument("--unrelated", action="append", default=[], metavar="NAME=QUERIES.jsonl",
                            help="无关问题集（可重复）：另一个话题或另一种语言的问题，库里没有答案；报告各方式第一名的分数"
                                 f"（取按 id 排序的前 {UNRELATED_LIMIT} 条）")
        parser.add_argument("--query-set", action="append", default=[], metavar="NAME=QUERIES.jsonl",
                            help="附加问题集（可重复）：同一批问题 id 的另一种写法，例如另一种语言的问题检索本知识库；"
                                 "沿用主 qrels，结果标为 方式@NAME")
        parser.add_argument("--per-query", type=Path, help="把逐题结果（各方式的指标、前 10 名、第一个相关结果的名次）"
                                                           "写成 JSON，供失败分析")
        parser.add_argument("--cache-query-embeddings", action="store_true",
                            help="查询向量也缓存到 RAG_DATA_DIR/eval-cache（反复评测省时；延迟随之不含查询向量化）")
        parser.add_argument("--unfitted", action="store_true",
                            help="摄取后不替知识库拟合相关概率模型：量新库在定时任务第一次拟合（摄取后一两分钟内）"
                                 "之前的分数——借同一 embedding 模型的另一个库的模型，或全局校准"
                                 "（默认像服务那样先拟合）")
        parser.add_argument("--fit-calibration", action="store_true",
                            help="用本次前 10 条结果与标注拟合不重排时的全局校准曲线，打印成 Calibration(...)，"
                                 "可作为新 embedding 模型的检索画像（raglib/retrieval_profile.py）")
        parser.add_argument("--compare", type=Path, metavar="OLD.json",
                            help="与以前 --output 写出的 JSON 比较，打印各方式各指标的差值")
        parser.add_argument("--limit", type=int, help="只取按 id 排序的前 N 个问题")
        parser.add_argument("--output", type=Path, help="把完整结果写成 JSON 文件")
        parser.add_argument("--keep", action="store_true", help="评测后保留知识库（默认删除）")
        parser.add_argument("--reuse-kb", help="复用 --keep 留下的知识库（名称或 id），跳过摄取")
        parser.add_argument("--no-progress", action="store_true", help="不显示进度条")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["sample"] == (options["dataset"] is not None):
            raise CommandError("给出数据集目录，或者用 --sample 评测内置的示例数据集（二者只能选一个）")
        # -v 2：结构化日志照常输出
        with command_output(self.stderr) if options["verbosity"] < 2 else nullcontext():
            if not options["sample"]:
                self._evaluate(options["dataset"], options)
                return
            if options["modes"] is None:
                options = {**options, "modes": ",".join(self._sample_modes())}
            with tempfile.TemporaryDirectory(prefix="ragservice-eval-") as directory:
                dataset = write_sample_dataset(Path(directory) / SAMPLE_NAME)
                self.stderr.write(f"示例数据集（临时生成于 {dataset}，评测完删除）")
                self._evaluate(dataset, options)
                self.stdout.write("\n这是内置的示例数据集，数字不代表你的数据上的效果。用自己的数据："
                                  "manage.py evaluate 数据集目录（BEIR 格式，见 README 的“检索质量评测”）")

    def _sample_modes(self) -> tuple[str, ...]:
        """示例评测的默认方式：配置的重排序模型（默认 bge-reranker-v2-m3）既不是本地目录也不在 Hugging Face
        缓存里时不跑 hybrid+rerank——离线时每次加载都要等 hub 的重试，一个十题的示例要多等两分多钟。"""
        reranker = configured_reranker()
        # 不重排（该方式秒出“跳过”）、远程服务（受它自己的超时约束）或本机已有的模型
        if reranker is None or locally_available(reranker.provider, reranker.model):
            return ALL_MODES
        self.stderr.write(f"重排序模型 {reranker.model} 不在本机，示例评测不跑 hybrid+rerank（要跑就用 --modes 指定）")
        return tuple(mode for mode in ALL_MODES if mode == REFERENCE_MODE or not MODES[mode][1])

    def _evaluate(self, directory: Path, options: dict[str, Any]) -> None:
        modes = tuple(m.strip() for m in (options["modes"] or ",".join(ALL_MODES)).split(",") if m.strip())
        unknown = [m for m in modes if m not in ALL_MODES]
        if unknown or not modes:
            raise CommandError(f"unknown mode(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(ALL_MODES)}")
        if options["limit"] is not None and options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        try:
            dataset = load_dataset(directory, options["level"], documents=options["documents"],
                                   queries=options["queries"], qrels=options["qrels"], limit=options["limit"])
        except DatasetError as exc:
            raise CommandError(str(exc)) from exc
        query_sets = self._query_sets(options["query_set"], dataset.queries)
        previous = self._previous(options["compare"])
        kb = self._reused(options["reuse_kb"])
        config = EvaluationConfig(chunking=options["chunking"], embedding_provider=options["embedding_provider"],
                                  embedding_model=options["embedding_model"], modes=modes, keep=options["keep"],
                                  query_sets=query_sets, cache_query_embeddings=options["cache_query_embeddings"],
                                  unrelated=self._unrelated(options["unrelated"]), unfitted=options["unfitted"])
        self.stderr.write(f"{dataset.name}：{len(dataset.units)} 个{'段落' if dataset.level == 'passage' else '文档'}，"
                          f"{len(dataset.queries)} 个问题，方式 {', '.join(modes)}")
        progress = _stage_lines(self.stderr) if options["no_progress"] else _progress
        report = run_evaluation(dataset, config, progress, kb=kb)
        if options["output"]:
            options["output"].parent.mkdir(parents=True, exist_ok=True)
            options["output"].write_text(json.dumps(report.as_dict(), ensure_ascii=False, indent=2) + "\n",
                                         encoding="utf-8")
        if options["per_query"]:
            options["per_query"].parent.mkdir(parents=True, exist_ok=True)
            options["per_query"].write_text(json.dumps(report.per_query_dict(), ensure_ascii=False) + "\n",
                                            encoding="utf-8")
        self.stdout.write(report.markdown())
        if options["fit_calibration"]:
            fitted = suggest({m.mode: m.per_query for m in report.modes if not m.skipped}, dataset.qrels)
            self.stdout.write("\n拟合的全局校准曲线（前 10 条结果，逻辑回归；"
                              "检索画像 raglib/retrieval_profile.py 用）：\n"
                              + "Calibration(" + ", ".join(f"{key}={value}" for key, value in fitted.items()) + ")")
        if previous is not None:
            self.stdout.write("\n" + compare_reports(previous, report.as_dict()))
        self.stdout.write(f"\n总用时 {report.total_seconds:.0f} s" + ("" if config.keep or kb else
                                                                   "（知识库已删除）"))

    @staticmethod
    def _unrelated(specs: Sequence[str]) -> dict[str, list[str]]:
        """``NAME=FILE`` → 该文件里的问题文本（按 id 排序，取前 ``UNRELATED_LIMIT`` 条）。"""
        sets: dict[str, list[str]] = {}
        for spec in specs:
            name, sep, path = spec.partition("=")
            if not sep or not name.strip() or not path or name in sets:
                raise CommandError(f"--unrelated expects a unique NAME=QUERIES.jsonl, got {spec!r}")
            try:
                queries = sorted(read_queries(Path(path)), key=lambda q: q.id)
            except DatasetError as exc:
                raise CommandError(str(exc)) from exc
            sets[name.strip()] = [q.text for q in queries[:UNRELATED_LIMIT]]
        return sets

    @staticmethod
    def _query_sets(specs: Sequence[str], main: Sequence[Query]) -> dict[str, list[Query]]:
        """``NAME=FILE`` → 该文件里有 qrels 的问题（按 id 排序）；名称重复或文件不对时报错。"""
        sets: dict[str, list[Query]] = {}
        answers = {q.id: q.answers for q in main}
        for spec in specs:
            name, sep, path = spec.partition("=")
            if not sep or not name.strip() or not path or name in sets:
                raise CommandError(f"--query-set expects a unique NAME=QUERIES.jsonl, got {spec!r}")
            try:
                # 只取问题文本：标准答案是知识库里的原文，沿用主问题集的（换了语言的问题，答案字符串不变）
                queries = sorted((replace(q, answers=answers[q.id]) for q in read_queries(Path(path))
                                  if q.id in answers), key=lambda q: q.id)
            except DatasetError as exc:
                raise CommandError(str(exc)) from exc
            if not queries:
                raise CommandError(f"--query-set {name}: no query id of {path} is among the evaluated queries")
            sets[name.strip()] = queries
        return sets

    @staticmethod
    def _previous(path: Path | None) -> dict[str, Any] | None:
        if path is None:
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CommandError(f"--compare: cannot read {path}: {exc}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("modes"), dict):
            raise CommandError(f"--compare: {path} is not an evaluate --output report")
        return data

    @staticmethod
    def _reused(name_or_id: str | None) -> KnowledgeBase | None:
        if not name_or_id:
            return None
        kb = knowledge_base_by_name_or_id(name_or_id)
        if kb is None or not kb.is_enabled:
            raise CommandError(f"knowledge base {name_or_id!r} does not exist or is not enabled")
        return kb
