"""从 cmrc2018 派生一批很小的知识库（每库 1~4 篇文档，约 1~6 个分块），量新用户前几份文档上的分数。

    .venv/bin/python bench/derive_small_kbs.py ../shared/data/cmrc2018 var/eval-data/small_kbs
    for d in var/eval-data/small_kbs/s*; do
        .venv/bin/python manage.py evaluate "$d" --level document --modes vector,fulltext,hybrid \\
            --cache-query-embeddings --no-progress --unrelated toyhom=var/eval-data/small_kbs/toyhom40.jsonl \\
            --unrelated squad=var/eval-data/small_kbs/squad40.jsonl --output "$d.json" --per-query "$d.pq.json"
    done

每种大小（1、2、3、4 篇）各 ``--per-size`` 个库，文档按固定种子从有问题的文档里不放回地抽；每个库的问题是
``queries_all.jsonl`` 里答案在这几篇文档中的全部问题（1,500 题的样本一篇只有一两题，小库上太少），qrels 指向
文档。另从 toyhom_meddialog 与 squad_train_longdoc_en 各取按 id 排序的前 40 个问题，作每个小库的无关问题
（别的话题、别的语言）。
派生数据只放在本地（var/ 不入库），源数据集的许可同样适用。
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SIZES = (1, 2, 3, 4)
SEED = 20261130
UNRELATED = {"toyhom": "toyhom_meddialog", "squad": "squad_train_longdoc_en"}
UNRELATED_QUERIES = 40


def main(source: Path, target: Path, per_size: int) -> None:
    documents = [json.loads(line) for line in (source / "documents.jsonl").open(encoding="utf-8") if line.strip()]
    queries = {json.loads(line)["_id"]: line for line in (source / "queries_all.jsonl").open(encoding="utf-8")
               if line.strip()}
    asked: dict[str, list[str]] = {}
    for line in list((source / "qrels_doc.tsv").open(encoding="utf-8"))[1:]:
        query_id, doc_id, _ = line.rstrip("\n").split("\t")
        if query_id in queries:
            asked.setdefault(doc_id, []).append(query_id)
    pool = [document for document in documents if document["doc_id"] in asked]
    random.Random(SEED).shuffle(pool)
    taken = 0
    for size in SIZES:
        for number in range(per_size):
            group, taken = pool[taken:taken + size], taken + size
            out = target / f"s{size}_{number}"
            out.mkdir(parents=True, exist_ok=True)
            with (out / "documents.jsonl").open("w", encoding="utf-8") as f:
                f.writelines(json.dumps(document, ensure_ascii=False) + "\n" for document in group)
            with (out / "queries.jsonl").open("w", encoding="utf-8") as f:
                f.writelines(queries[q] for document in group for q in asked[document["doc_id"]])
            with (out / "qrels_doc.tsv").open("w", encoding="utf-8") as f:
                f.write("query-id\tcorpus-id\tscore\n")
                f.writelines(f"{q}\t{document['doc_id']}\t1\n" for document in group for q in asked[document["doc_id"]])
    for name, folder in UNRELATED.items():
        rows = sorted((json.loads(line) for line in (source.parent / folder / "queries.jsonl").open(encoding="utf-8")
                       if line.strip()), key=lambda row: row["_id"])[:UNRELATED_QUERIES]
        with (target / f"{name}{UNRELATED_QUERIES}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    print(f"wrote {target}: {len(SIZES) * per_size} knowledge bases from {taken} documents")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("source", type=Path,
                        help="cmrc2018 数据集目录（它的上一级里要有 toyhom_meddialog 与 squad_train_longdoc_en）")
    parser.add_argument("target", type=Path, help="输出目录（不存在时创建）")
    parser.add_argument("--per-size", type=int, default=10, help="每种大小的库数（默认 10）")
    args = parser.parse_args()
    main(args.source, args.target, args.per_size)
