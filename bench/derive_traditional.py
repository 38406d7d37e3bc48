"""从开发集派生繁体版本（OpenCC 简→繁，台湾用字），评测繁体文本与跨文字检索。

    .venv/bin/python bench/derive_traditional.py ../shared/data/cmrc2018 var/eval-data/cmrc2018_hant

输出目录是完整的 BEIR 数据集（corpus/documents/queries 的 title、text 与答案都转成繁体，qrels 原样复制），
可以直接交给 ``manage.py evaluate``；其中 ``queries.jsonl`` 也可以用 ``--query-set hant=…`` 对简体知识库提问
（跨文字）。派生数据只放在本地（var/ 不入库），源数据集的许可同样适用。
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import opencc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.helpers.beir import copy_files, rewrite_jsonl

CONVERTER = opencc.OpenCC("s2twp")


def convert(value: object) -> object:
    if isinstance(value, str):
        return CONVERTER.convert(value)
    if isinstance(value, list):
        return [convert(item) for item in value]
    if isinstance(value, dict):
        # 答案的字符偏移在简繁转换后大多不变（逐字转换），但词组级转换可能改变长度：只转文本，偏移原样保留
        return {key: convert(item) if key in ("text", "title", "answers") else item for key, item in value.items()}
    return value


def main(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name in ("corpus.jsonl", "documents.jsonl", "queries.jsonl"):
        rewrite_jsonl(source, target, name, lambda row: {
            key: convert(value) if key in ("text", "title", "metadata") else value for key, value in row.items()})
    copy_files(source, target, ("qrels.tsv", "qrels_doc.tsv"))
    print(f"wrote {target}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("source", type=Path, help="BEIR 格式的源数据集目录")
    parser.add_argument("target", type=Path, help="输出目录（不存在时创建）")
    args = parser.parse_args()
    main(args.source, args.target)
