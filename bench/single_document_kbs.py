"""只有一篇文档的知识库（一本手册、一篇长文）上的分数：按分块判相关——分块里有标准答案才算（需要 ``../shared``）。

    .venv/bin/python bench/single_document_kbs.py ../shared/data/squad_train_longdoc_en \\
        --unrelated ../shared/data/cmrc2018/queries.jsonl --output single.json

``manage.py evaluate`` 按文档判相关，同一篇文档的分块在报告里并成一条：一篇文档的库上每条结果都“相关”，量不出分数
有没有用。这里数据集的每篇文档单独建一个库（真实的上传与摄取流水线、服务会做的拟合），用这篇文档的问题检索，
前 10 个分块判相关，两种判法各报一遍 0.5 处的精确率 / 召回率与 AUC、第一名对不对（answer-hit@1）、前五名里有没有对的
（answer-hit@5）：

- **含答案**：分块里有标准答案的字符串（``metadata.answers``，逐字）。宽松：约三分之一的答案字符串在同一篇文档的
  好几块里出现（一个年份、一个人名），不在答案那句的分块也算对；
- **按偏移**：分块在文档里的位置盖住了标准答案的偏移（``doc_start``）——只有答案原处的那一两块（相邻分块有重叠）算对。
  分块的位置由分块文本在上传正文里按顺序查找得到；找不到的分块（解析改了文字）按“含答案”判，报找到的比例。

另报第一名的分数；``--unrelated`` 的问题（别的话题或语言，取前 40 个）报第一名的分数。

中文的长文档由 ``bench/derive_long_documents.py --group 40`` 派生（cmrc2018 每 40 篇条目拼成一册，答案偏移随之平移）::

    .venv/bin/python bench/derive_long_documents.py ../shared/data/cmrc2018 var/eval-data/cmrc2018_long40 --group 40
    .venv/bin/python bench/single_document_kbs.py var/eval-data/cmrc2018_long40 --docs 10 \\
        --unrelated ../shared/data/squad_train_longdoc_en/queries.jsonl

``--companions N``：每个库另放 N 篇别的话题的短文档（数据集里排在后面的文档各取前 :data:`COMPANION_CHARS` 个字），
问题仍只问那篇长文档：一份招标文件加几份附件、一本手册加几页说明——库被一篇文档占了大半的样子::

    .venv/bin/python bench/single_document_kbs.py ../shared/data/squad_train_longdoc_en --companions 3 \\
        --unrelated ../shared/data/cmrc2018/queries.jsonl
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django_setup import setup_django

setup_django(RAG_QUEUE_SYNC="true", RAG_RERANK_PROVIDER="none")

from documents.models import DocumentChunk  # noqa: E402
from documents.services import document_upload  # noqa: E402
from infra.principal import SYSTEM_PRINCIPAL  # noqa: E402
from knowledge.services import knowledge_base_create, knowledge_base_delete  # noqa: E402
from raglib.evaluation.metrics import percentile  # noqa: E402
from raglib.scoring import REFERENCE_THRESHOLD  # noqa: E402
from search import profiles, segments, services  # noqa: E402
from search.evaluation.runner import score_separation  # noqa: E402
from search.relevance import relevance_refresh  # noqa: E402

MODES: tuple[services.Mode, ...] = ("vector", "fulltext", "hybrid")
UNRELATED = 40
# --companions 的短文档各取原文的前这么多个字
COMPANION_CHARS = 1500


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]


JUDGEMENTS = ("contains", "offset")


@dataclass(frozen=True)
class Case:
    """建成一个库的一篇文档：上传的正文、问它的问题、答案偏移要平移多少（上传的正文前面多了标题行），以及同库的短文档
    （(名字, 正文)）。"""

    name: str
    title: str
    body: str
    questions: list[dict[str, Any]]
    shift: int
    companions: tuple[tuple[str, str], ...]


def cases(documents: list[dict[str, Any]], asked: dict[str, list[dict[str, Any]]], companions: int) -> list[Case]:
    """每篇有问题的文档一个库；第 k 个库的 ``companions`` 篇短文档是数据集的第 k·companions + 1 篇起往后（循环取，
    跳过它自己）各取前 :data:`COMPANION_CHARS` 个字：各库的短文档不同。"""
    made: list[Case] = []
    for document in documents:
        if document["doc_id"] not in asked:
            continue
        title = str(document.get("title") or "")
        body = f"# {title}\n\n{document['text']}" if title else str(document["text"])
        start = len(made) * companions
        following = (documents[(start + offset) % len(documents)] for offset in range(1, len(documents)))
        others = [other for other in following if other is not document][:companions]
        made.append(Case(document["doc_id"], title, body, asked[document["doc_id"]], body.index(str(document["text"])),
                         tuple((str(o["doc_id"]), str(o["text"])[:COMPANION_CHARS]) for o in others)))
    return made


def chunk_spans(document_id: Any, body: str) -> dict[int, tuple[int, int]]:
    """该文档的分块 id → 它在上传正文里的 [起, 止)：按分块序号依次查找（相邻分块有重叠，从上一块的起点往后找）；
    找不到的分块（解析改了文字）不在结果里。"""
    spans: dict[int, tuple[int, int]] = {}
    cursor = 0
    for chunk_id, text in (DocumentChunk.objects.filter(document_id=document_id).exclude(role="parent")
                           .order_by("chunk_index").values_list("id", "chunk_text")):
        start = body.find(text, cursor)
        if start >= 0:
            spans[chunk_id] = (start, start + len(text))
            cursor = start
    return spans


def _labels(question: dict[str, Any], chunk: Any, spans: dict[int, tuple[int, int]], shift: int,
            document_id: Any) -> tuple[bool, bool]:
    """(含答案, 按偏移)：见模块说明。同库短文档的分块按偏移判总是不相关（答案的偏移在长文档里）；长文档里
    找不到位置的分块、答案没有偏移的问题（cmrc2018 有几题）按偏移判时沿用含答案。"""
    answers = question["metadata"]["answers"]
    contains = any(a["text"] in chunk.text for a in answers)
    if chunk.document_id != document_id:
        return contains, False
    placed = [(a["doc_start"] + shift, a["doc_start"] + shift + len(a["text"])) for a in answers
              if a.get("doc_start") is not None]
    span = spans.get(chunk.chunk_id)
    if span is None or not placed:
        return contains, contains
    return contains, any(span[0] <= start and end <= span[1] for start, end in placed)


def _measure(kb: Any, document: Case, uploaded: Any, unrelated: list[str]) -> dict[str, Any]:
    spans = chunk_spans(uploaded.id, document.body)
    result: dict[str, Any] = {"origin": profiles.model_origin(kb.id), "modes": {}}
    for mode in MODES:
        pairs: dict[str, list[tuple[float, bool]]] = {judgement: [] for judgement in JUDGEMENTS}
        hits = {judgement: [0, 0] for judgement in JUDGEMENTS}  # 第一名对、前五名里有对的
        tops: list[float] = []
        located = own = 0
        for question in document.questions:
            found = services.search(kb, services.SearchRequest(query=question["text"], top_k=10, mode=mode,
                                                               rerank=False)).results
            judged = [_labels(question, r.chunk, spans, document.shift, uploaded.id) for r in found]
            for index, judgement in enumerate(JUDGEMENTS):
                labels = [row[index] for row in judged]
                pairs[judgement].extend((r.score, label) for r, label in zip(found, labels, strict=True))
                hits[judgement][0] += any(labels[:1])
                hits[judgement][1] += any(labels[:5])
            own_chunks = [r.chunk.chunk_id for r in found if r.chunk.document_id == uploaded.id]
            located += sum(chunk_id in spans for chunk_id in own_chunks)
            own += len(own_chunks)
            if found:
                tops.append(found[0].score)
        strangers = []
        for text in unrelated:
            found = services.search(kb, services.SearchRequest(query=text, top_k=1, mode=mode, rerank=False)).results
            strangers.append(found[0].score if found else 0.0)
        result["modes"][mode] = {"pairs": pairs, "hits": hits, "questions": len(document.questions), "top1": tops,
                                 "unrelated_top1": strangers, "located": located, "returned": own}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", type=Path, help="文档级数据集（documents.jsonl、queries.jsonl、qrels_doc.tsv）")
    parser.add_argument("--unrelated", type=Path, required=True, help="无关问题（queries.jsonl），取前 40 个")
    parser.add_argument("--docs", type=int, default=0, help="只建前几个库（0 = 全部）")
    parser.add_argument("--companions", type=int, default=0, help="每个库另放几篇别的话题的短文档（默认 0）")
    parser.add_argument("--output", type=Path, help="逐库结果写成 JSON")
    args = parser.parse_args()

    documents = _jsonl(args.dataset / "documents.jsonl")
    questions = {q["_id"]: q for q in _jsonl(args.dataset / "queries.jsonl")}
    asked: dict[str, list[dict[str, Any]]] = {}
    for line in (args.dataset / "qrels_doc.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        query_id, doc_id, _ = line.split("\t")
        if query_id in questions:
            asked.setdefault(doc_id, []).append(questions[query_id])
    unrelated = [str(q["text"]) for q in _jsonl(args.unrelated)][:UNRELATED]
    chosen = cases(documents, asked, args.companions)[:args.docs or None]

    per_kb = []
    for document in chosen:
        kb = knowledge_base_create(principal=SYSTEM_PRINCIPAL, name=f"bench-single-{document.name}-{time.time_ns()}")
        try:
            uploaded = document_upload(kb=kb, filename=f"{document.name}.md",
                                       upload=io.BytesIO(document.body.encode()), metadata={"title": document.title},
                                       chunking={})
            for name, text in document.companions:
                document_upload(kb=kb, filename=f"{name}.md", upload=io.BytesIO(text.encode()), metadata={},
                                chunking={})
            segments.settle(kb.id)
            relevance_refresh(only=kb.id, settled=True)
            measured = _measure(kb, document, uploaded, unrelated)
            measured.update(doc_id=document.name, chunks=kb.chunks.count())
            per_kb.append(measured)
            print(f"{document.name}: {measured['chunks']} 块，{len(document.questions)} 题，"
                  f"分数来自 {measured['origin']}", file=sys.stderr)
        finally:
            knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)

    print(f"{len(per_kb)} 个单文档库（{sum(k['chunks'] for k in per_kb)} 个分块），分数来自："
          f"{sorted({k['origin'] for k in per_kb})}")
    print("| 方式 | 判法 | 问题数 | answer-hit@1 | answer-hit@5 | 0.5 处精确率 / 召回率 | AUC | 第一名分数中位数 | "
          "无关问题第一名 均值（p95） | 找到位置的结果 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        rows = [k["modes"][mode] for k in per_kb]
        asked_count = sum(row["questions"] for row in rows)
        tops = [score for row in rows for score in row["top1"]]
        strangers = [score for row in rows for score in row["unrelated_top1"]]
        located = sum(row["located"] for row in rows) / max(sum(row["returned"] for row in rows), 1)
        for judgement in JUDGEMENTS:
            separation = score_separation([pair for row in rows for pair in row["pairs"][judgement]],
                                          REFERENCE_THRESHOLD)
            auc = separation.get("auc", float("nan"))
            print(f"| {mode} | {judgement} | {asked_count} | "
                  f"{sum(row['hits'][judgement][0] for row in rows) / asked_count:.3f} | "
                  f"{sum(row['hits'][judgement][1] for row in rows) / asked_count:.3f} | "
                  f"{separation['precision']:.3f} / {separation['recall']:.3f} | {auc:.3f} | "
                  f"{percentile(tops, 50):.3f} | {sum(strangers) / len(strangers):.3f}"
                  f"（{percentile(strangers, 95):.3f}） | {located:.3f} |")
    if args.output:
        args.output.write_text(json.dumps(per_kb, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
