"""只有一篇文档的知识库（一本手册、一篇长文）上的分数：按分块判相关——分块里有标准答案才算（需要 ``../shared``）。

    .venv/bin/python bench/single_document_kbs.py ../shared/data/squad_train_longdoc_en \\
        --unrelated ../shared/data/cmrc2018/queries.jsonl --output single.json

``manage.py evaluate`` 按文档判相关，同一篇文档的分块在报告里并成一条：一篇文档的库上每条结果都“相关”，量不出分数
有没有用。这里数据集的每篇文档单独建一个库（真实的上传与摄取流水线、服务会做的拟合），用这篇文档的问题检索，
前 10 个分块各按“分块里有没有标准答案”（``metadata.answers``，逐字）判相关，报 0.5 处的精确率 / 召回率与 AUC、
第一名对不对（answer-hit@1）、第一名的分数；``--unrelated`` 的问题（别的话题或语言，取前 40 个）报第一名的分数。
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

from django_setup import setup_django

setup_django(RAG_QUEUE_SYNC="true", RAG_RERANK_PROVIDER="none")

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


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]


def _measure(kb: Any, questions: list[dict[str, Any]], unrelated: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {"origin": profiles.model_origin(kb.id), "modes": {}}
    for mode in MODES:
        pairs: list[tuple[float, bool]] = []
        tops: list[float] = []
        hits = 0
        for question in questions:
            answers = [a["text"] for a in question["metadata"]["answers"]]
            found = services.search(kb, services.SearchRequest(query=question["text"], top_k=10, mode=mode,
                                                               rerank=False)).results
            labels = [any(answer in r.chunk.text for answer in answers) for r in found]
            pairs.extend((r.score, label) for r, label in zip(found, labels, strict=True))
            if found:
                tops.append(found[0].score)
                hits += labels[0]
        strangers = []
        for text in unrelated:
            found = services.search(kb, services.SearchRequest(query=text, top_k=1, mode=mode, rerank=False)).results
            strangers.append(found[0].score if found else 0.0)
        result["modes"][mode] = {"pairs": pairs, "hit1": hits, "questions": len(questions), "top1": tops,
                                 "unrelated_top1": strangers}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", type=Path, help="文档级数据集（documents.jsonl、queries.jsonl、qrels_doc.tsv）")
    parser.add_argument("--unrelated", type=Path, required=True, help="无关问题（queries.jsonl），取前 40 个")
    parser.add_argument("--docs", type=int, default=0, help="只取前几篇文档（0 = 全部）")
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
    chosen = [d for d in documents if d["doc_id"] in asked][:args.docs or None]

    per_kb = []
    for document in chosen:
        kb = knowledge_base_create(principal=SYSTEM_PRINCIPAL,
                                   name=f"bench-single-{document['doc_id']}-{time.time_ns()}")
        try:
            body = f"# {document['title']}\n\n{document['text']}" if document.get("title") else str(document["text"])
            document_upload(kb=kb, filename=f"{document['doc_id']}.md", upload=io.BytesIO(body.encode()),
                            metadata={"title": document.get("title", "")}, chunking={})
            segments.settle(kb.id)
            relevance_refresh(only=kb.id, settled=True)
            measured = _measure(kb, asked[document["doc_id"]], unrelated)
            measured.update(doc_id=document["doc_id"], chunks=kb.chunks.count())
            per_kb.append(measured)
            print(f"{document['doc_id']}: {measured['chunks']} 块，{len(asked[document['doc_id']])} 题，"
                  f"分数来自 {measured['origin']}", file=sys.stderr)
        finally:
            knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)

    print(f"{len(per_kb)} 个单文档库（{sum(k['chunks'] for k in per_kb)} 个分块），分数来自："
          f"{sorted({k['origin'] for k in per_kb})}")
    print("| 方式 | 问题数 | answer-hit@1 | 0.5 处精确率 / 召回率（分块里有答案） | AUC | 第一名分数中位数 | "
          "无关问题第一名 均值（p95） |")
    print("|---|---|---|---|---|---|---|")
    for mode in MODES:
        rows = [k["modes"][mode] for k in per_kb]
        pairs = [pair for row in rows for pair in row["pairs"]]
        separation = score_separation(pairs, REFERENCE_THRESHOLD)
        asked_count = sum(row["questions"] for row in rows)
        tops = [score for row in rows for score in row["top1"]]
        strangers = [score for row in rows for score in row["unrelated_top1"]]
        auc = separation.get("auc", float("nan"))
        print(f"| {mode} | {asked_count} | {sum(row['hit1'] for row in rows) / asked_count:.3f} | "
              f"{separation['precision']:.3f} / {separation['recall']:.3f} | {auc:.3f} | {percentile(tops, 50):.3f} | "
              f"{sum(strangers) / len(strangers):.3f}（{percentile(strangers, 95):.3f}） |")
    if args.output:
        args.output.write_text(json.dumps(per_kb, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
