"""从 cmrc2018 派生“长文档”评测集：按固定种子把 8 篇百科条目拼成一份分章节的长文档。

    .venv/bin/python bench/derive_long_documents.py ../shared/data/cmrc2018 var/eval-data/cmrc2018_long [册数] \\
        [--group 篇数]

cmrc2018 的条目平均约 500 字，默认分块下几乎一篇一个分块，测不出“分块带标题上下文”与“分块大小”的差别。拼成长文档后
（标题“百科选编 第 N 册”，每个条目是一个 ``## 条目名`` 章节），大多数分块落在章节中间、自己不含条目名，像真实的长报告、
标书一样。问题原样保留，答案的 ``doc_start`` 平移成在长文档正文里的偏移，qrels 改指向所在的长文档；answer-hit（前 k
个分块逐字含答案）与分块方式无关，是主要指标。给出册数时只取前这么多册（及答案在其中的问题），在慢机器上缩短摄取；
``--group`` 改每册的篇数（``bench/single_document_kbs.py`` 用 40 篇一册：一册几十个分块，像一本手册）。
派生数据只放在本地（var/ 不入库），源数据集的许可同样适用。
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

GROUP = 8


def main(source: Path, target: Path, volumes: int | None = None, group: int = GROUP) -> None:
    articles = [json.loads(line) for line in (source / "documents.jsonl").open(encoding="utf-8") if line.strip()]
    random.Random(20261124).shuffle(articles)
    articles = articles[:volumes * group] if volumes else articles
    target.mkdir(parents=True, exist_ok=True)
    owner: dict[str, str] = {}
    # 条目原文在它那一册正文里的起点：答案偏移随之平移
    shift: dict[str, int] = {}
    with (target / "documents.jsonl").open("w", encoding="utf-8") as out:
        for number, start in enumerate(range(0, len(articles), group), start=1):
            doc_id = f"cmrc-long-{number:03d}"
            parts = []
            length = 0
            for article in articles[start:start + group]:
                owner[article["doc_id"]] = doc_id
                heading = f"## {article['title']}\n\n"
                shift[article["doc_id"]] = length + len(heading)
                parts.append(heading + article["text"])
                length += len(parts[-1]) + 2
            out.write(json.dumps({"doc_id": doc_id, "title": f"百科选编 第 {number} 册", "text": "\n\n".join(parts)},
                                 ensure_ascii=False) + "\n")
    with (source / "qrels_doc.tsv").open(encoding="utf-8") as src, \
            (target / "qrels_doc.tsv").open("w", encoding="utf-8") as dst:
        dst.write(src.readline())
        seen = set()
        for line in src:
            query, doc, score = line.rstrip("\n").split("\t")
            if doc in owner and (query, owner[doc]) not in seen:
                seen.add((query, owner[doc]))
                dst.write(f"{query}\t{owner[doc]}\t{score}\n")
    with (source / "queries.jsonl").open(encoding="utf-8") as src, \
            (target / "queries.jsonl").open("w", encoding="utf-8") as dst:
        asked = {query for query, _ in seen}
        queries = (json.loads(line) for line in src if line.strip())
        kept = [_shifted(query, shift) for query in queries if query["_id"] in asked]
        dst.writelines(json.dumps(query, ensure_ascii=False) + "\n" for query in kept)
    print(f"wrote {target}: {len(articles)} articles in {len(set(owner.values()))} documents, {len(kept)} questions")


def _shifted(query: dict[str, Any], shift: dict[str, int]) -> dict[str, Any]:
    """答案的 ``doc_start`` 平移成长文档里的偏移。答案所在的条目没有派生进来（只取了前几册，问题经另一篇相关条目
    留下）时偏移无从谈起，记为空。"""
    moved = shift.get(query["metadata"]["doc_id"])
    for answer in query["metadata"]["answers"]:
        if answer.get("doc_start") is not None:
            answer["doc_start"] = None if moved is None else answer["doc_start"] + moved
    return query


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("source", type=Path, help="cmrc2018 数据集目录")
    parser.add_argument("target", type=Path, help="输出目录（不存在时创建）")
    parser.add_argument("volumes", type=int, nargs="?", help="只取前这么多册（默认全部）")
    parser.add_argument("--group", type=int, default=GROUP, help=f"每册几篇条目（默认 {GROUP}）")
    args = parser.parse_args()
    main(args.source, args.target, args.volumes, args.group)
