"""从开发集派生一批很小的知识库（每库几篇文档或几段），量新用户前几份文档上的分数。

    .venv/bin/python bench/derive_small_kbs.py ../shared/data/cmrc2018 var/eval-data/small_kbs
    for d in var/eval-data/small_kbs/s*; do
        .venv/bin/python manage.py evaluate "$d" --level document --modes vector,fulltext,hybrid \\
            --cache-query-embeddings --no-progress --unrelated toyhom=var/eval-data/small_kbs/toyhom40.jsonl \\
            --unrelated squad=var/eval-data/small_kbs/squad40.jsonl --output "$d.json" --per-query "$d.pq.json"
    done
    # 段落级（toyhom_meddialog：一段一个分块），2~4 段的库各 8 个，无关问题取 cmrc2018 与 squad 的
    .venv/bin/python bench/derive_small_kbs.py ../shared/data/toyhom_meddialog var/eval-data/small_toyhom \\
        --level passage --sizes 2 3 4 --per-size 8 --unrelated cmrc=cmrc2018 squad=squad_train_longdoc_en

每种大小各 ``--per-size`` 个库，文档（段落级时是段落）按固定种子从有问题的里不放回地抽；每个库的问题是答案在这几篇里的
全部问题（文档级取 ``queries_all.jsonl``：1,500 题的样本一篇只有一两题，小库上太少；没有它时取 ``queries.jsonl``）。
另从 ``--unrelated`` 的几个集各取按 id 排序的前 40 个问题，作每个小库的无关问题（别的话题、别的语言）。
派生数据只放在本地（var/ 不入库），源数据集的许可同样适用。
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 20261130
UNRELATED_QUERIES = 40


def main(source: Path, target: Path, *, level: str, sizes: list[int], per_size: int,
         unrelated: dict[str, str]) -> None:
    units_file, qrels_file, id_key = (("documents.jsonl", "qrels_doc.tsv", "doc_id") if level == "document"
                                      else ("corpus.jsonl", "qrels.tsv", "_id"))
    queries_file = source / "queries_all.jsonl" if level == "document" else source / "queries.jsonl"
    if not queries_file.exists():
        queries_file = source / "queries.jsonl"
    units = {json.loads(line)[id_key]: line for line in (source / units_file).open(encoding="utf-8") if line.strip()}
    queries = {json.loads(line)["_id"]: line for line in queries_file.open(encoding="utf-8") if line.strip()}
    asked: dict[str, list[str]] = {}
    for line in list((source / qrels_file).open(encoding="utf-8"))[1:]:
        query_id, unit_id, _ = line.rstrip("\n").split("\t")
        if query_id in queries and unit_id in units:
            asked.setdefault(unit_id, []).append(query_id)
    # 文档级按文件里的顺序抽，段落级按 id 排序后抽（两种都是固定种子、结果确定）
    pool = [unit for unit in units if unit in asked] if level == "document" else sorted(asked)
    random.Random(SEED).shuffle(pool)
    taken = 0
    prefix = "s" if level == "document" else "t"
    for size in sizes:
        for number in range(per_size):
            group, taken = pool[taken:taken + size], taken + size
            out = target / f"{prefix}{size}_{number}"
            out.mkdir(parents=True, exist_ok=True)
            (out / units_file).write_text("".join(units[unit] if units[unit].endswith("\n") else units[unit] + "\n"
                                                  for unit in group), encoding="utf-8")
            (out / "queries.jsonl").write_text("".join(queries[q] for unit in group for q in asked[unit]),
                                               encoding="utf-8")
            (out / qrels_file).write_text("query-id\tcorpus-id\tscore\n"
                                          + "".join(f"{q}\t{unit}\t1\n" for unit in group for q in asked[unit]),
                                          encoding="utf-8")
    for name, folder in unrelated.items():
        rows = sorted((json.loads(line) for line in (source.parent / folder / "queries.jsonl").open(encoding="utf-8")
                       if line.strip()), key=lambda row: row["_id"])[:UNRELATED_QUERIES]
        (target / f"{name}{UNRELATED_QUERIES}.jsonl").write_text(
            "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    print(f"wrote {target}: {len(sizes) * per_size} knowledge bases from {taken} {level}s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("source", type=Path, help="BEIR 格式的开发集目录（它的上一级里要有 --unrelated 的那几个集）")
    parser.add_argument("target", type=Path, help="输出目录（不存在时创建）")
    parser.add_argument("--level", choices=("document", "passage"), default="document",
                        help="document：每库几篇文档（documents.jsonl、qrels_doc.tsv）；passage：每库几段（corpus.jsonl、qrels.tsv）")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 4],
                        help="每库的文档（段落）数（默认 1 2 3 4）")
    parser.add_argument("--per-size", type=int, default=10, help="每种大小的库数（默认 10）")
    parser.add_argument("--unrelated", nargs="+", default=["toyhom=toyhom_meddialog", "squad=squad_train_longdoc_en"],
                        metavar="NAME=FOLDER", help="无关问题取自哪些集（与 source 同一级的目录名）")
    args = parser.parse_args()
    main(args.source, args.target, level=args.level, sizes=args.sizes, per_size=args.per_size,
         unrelated=dict(item.split("=", 1) for item in args.unrelated))
