"""BEIR 格式数据集的读取：corpus.jsonl、queries.jsonl、qrels.tsv，可选 documents.jsonl 与 qrels_doc.tsv。"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Level = Literal["passage", "document"]


class DatasetError(Exception):
    """数据集文件缺失或格式不对；消息里指出文件与行号。"""


@dataclass(frozen=True)
class Unit:
    """被摄取的一个单元：段落级是一个 corpus 段落，文档级是一篇文档。"""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Query:
    id: str
    text: str
    answers: tuple[str, ...] = ()


@dataclass
class Dataset:
    name: str
    level: Level
    units: list[Unit]
    queries: list[Query]
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise DatasetError(f"{path} does not exist")
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{number}: invalid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{number}: expected a JSON object")
            yield number, row


def _field(path: Path, number: int, row: dict[str, Any], *names: str) -> str:
    for name in names:
        value = row.get(name)
        if isinstance(value, str | int) and str(value) != "":
            return str(value)
    raise DatasetError(f"{path}:{number}: missing field {' or '.join(names)!r}")


def read_units(path: Path, level: Level) -> list[Unit]:
    """段落级读 ``_id``，文档级读 ``doc_id``（也接受 ``_id``）。"""
    names = ("_id",) if level == "passage" else ("doc_id", "_id")
    units = [Unit(_field(path, n, row, *names), str(row.get("title") or ""), _field(path, n, row, "text"))
             for n, row in _jsonl(path)]
    seen: set[str] = set()
    for unit in units:
        if unit.id in seen:
            raise DatasetError(f"{path}: duplicate id {unit.id!r}")
        seen.add(unit.id)
    return units


def read_queries(path: Path) -> list[Query]:
    queries = []
    for number, row in _jsonl(path):
        metadata = row.get("metadata") or {}
        answers = metadata.get("answers") if isinstance(metadata, dict) else None
        texts = tuple(str(a["text"]) for a in answers or () if isinstance(a, dict) and a.get("text"))
        queries.append(Query(_field(path, number, row, "_id"), _field(path, number, row, "text"), texts))
    return queries


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """``query-id corpus-id score`` 的 TSV（首行为表头）。"""
    if not path.is_file():
        raise DatasetError(f"{path} does not exist")
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t")
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != ["query-id", "corpus-id", "score"]:
            raise DatasetError(f"{path}: the header must be 'query-id<TAB>corpus-id<TAB>score'")
        for number, row in enumerate(reader, start=2):
            if not row or not "".join(row).strip():
                continue
            try:
                query_id, doc_id, score = row[0].strip(), row[1].strip(), int(float(row[2]))
            except (IndexError, ValueError) as exc:
                raise DatasetError(f"{path}:{number}: expected query-id, corpus-id and an integer score") from exc
            qrels.setdefault(query_id, {})[doc_id] = score
    return qrels


def load_dataset(directory: Path, level: Level, *, documents: Path | None = None, queries: Path | None = None,
                 qrels: Path | None = None, limit: int | None = None) -> Dataset:
    """读取数据集。``documents``/``queries``/``qrels`` 覆盖对应文件（例如用一种文字的问题检索另一种文字的文档）。

    只保留在 qrels 中有相关标注的问题，按 id 排序后取前 ``limit`` 个，结果确定。
    """
    default_units = "corpus.jsonl" if level == "passage" else "documents.jsonl"
    default_qrels = "qrels.tsv" if level == "passage" else "qrels_doc.tsv"
    units = read_units(documents or directory / default_units, level)
    judged = read_qrels(qrels or directory / default_qrels)
    wanted = sorted((q for q in read_queries(queries or directory / "queries.jsonl")
                     if any(grade > 0 for grade in judged.get(q.id, {}).values())), key=lambda q: q.id)
    if limit is not None:
        wanted = wanted[:limit]
    if not wanted:
        raise DatasetError("no query has a relevant judgement in the qrels file")
    return Dataset(name=directory.name, level=level, units=units, queries=wanted,
                   qrels={q.id: judged[q.id] for q in wanted})
