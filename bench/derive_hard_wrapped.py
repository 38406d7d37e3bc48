"""从开发集派生“硬换行”版本：正文按固定栏宽折行，像 PDF 文字层转出来的文本。

    .venv/bin/python bench/derive_hard_wrapped.py ../shared/data/squad_train_longdoc_en var/eval-data/squad_wrapped

pdfminer 按版面逐行取字，论文、报告的 PDF 转出的正文在句子中间每 70~90 个字符就有一个换行（段落之间才是空行）。
开发集的文本都来自网页，没有这种换行，量不出检索对它是否敏感。这里把 ``documents.jsonl``、``corpus.jsonl`` 的正文里
超过栏宽的行在最后一个空格处折开：只把空格换成换行，字符偏移全部不变；标准答案所在的那一段不折（answer-hit 按答案
逐字出现在分块里判，答案中间换了行就判不中了，那是派生造成的，不是检索的错）。问题、qrels 原样复制。
派生数据只放在本地（var/ 不入库），源数据集的许可同样适用。
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.helpers.beir import copy_files, rewrite_jsonl

WIDTH = 80


def wrap(text: str, protected: list[tuple[int, int]], width: int = WIDTH) -> str:
    """把超过 ``width`` 的行在最后一个可折的空格处折开；落在 ``protected`` 区间 [start, end) 里的空格不折。"""
    chars = list(text)
    line_start = 0
    last_space = -1
    for position, char in enumerate(chars):
        if char == "\n":
            line_start, last_space = position + 1, -1
            continue
        if char == " " and not any(start <= position < end for start, end in protected):
            last_space = position
        if position - line_start >= width and last_space > line_start:
            chars[last_space] = "\n"
            line_start, last_space = last_space + 1, -1
    return "".join(chars)


def main(source: Path, target: Path, width: int) -> None:
    target.mkdir(parents=True, exist_ok=True)
    # 答案在文档、段落里的区间：这些地方不折行
    in_documents: dict[str, list[tuple[int, int]]] = defaultdict(list)
    in_passages: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for line in (source / "queries.jsonl").open(encoding="utf-8"):
        if not line.strip():
            continue
        metadata = json.loads(line).get("metadata") or {}
        for answer in metadata.get("answers") or ():
            length = len(answer.get("text") or "")
            if answer.get("doc_start") is not None and metadata.get("doc_id"):
                in_documents[metadata["doc_id"]].append((answer["doc_start"], answer["doc_start"] + length))
            if answer.get("passage_start") is not None and metadata.get("passage_id"):
                in_passages[metadata["passage_id"]].append(
                    (answer["passage_start"], answer["passage_start"] + length))
    rewrite_jsonl(source, target, "documents.jsonl",
                  lambda row: {**row, "text": wrap(row["text"], in_documents.get(row["doc_id"], []), width)})
    rewrite_jsonl(source, target, "corpus.jsonl",
                  lambda row: {**row, "text": wrap(row["text"], in_passages.get(row["_id"], []), width)})
    copy_files(source, target, ("queries.jsonl", "qrels.tsv", "qrels_doc.tsv"))
    print(f"wrote {target}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("source", type=Path, help="BEIR 格式的源数据集目录")
    parser.add_argument("target", type=Path, help="输出目录（不存在时创建）")
    parser.add_argument("--width", type=int, default=WIDTH, help=f"栏宽（字符，默认 {WIDTH}）")
    args = parser.parse_args()
    main(args.source, args.target, args.width)
