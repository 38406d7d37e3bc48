"""CSV：与 XLSX 的工作表一样解析成 Markdown 表格；按行分组，每组一个片段，每组都重复表头行。

为什么每组重复表头：检索返回的是分块，一块里只有“张三 | 信息技术部 | 138…”而没有“姓名 | 部门 | 电话”，
问答时就不知道哪一列是什么。每组以 ``## 第 a 至 b 行`` 标题开头、紧跟表头行与对齐行，分块在标题前切
（token、parent_child 策略；recursive、paragraph 在组之间的空行处切），所以只要一组不超过块大小，
每个分块都从一组的开头起、带着表头。组的大小按字符数控制（``GROUP_CHARS``，中文约 200 个 token，
小于各策略的默认块大小），表头很宽时组跟着放大，表头的重复最多占正文的四分之一左右。
semantic 策略按句子相似度切，不保证；块大小调得比一组还小时，一组会被切开，后面的块没有表头。

- 编码：与 TXT 相同的判定（BOM → 严格 UTF-8 → GB18030/Big5 按常用字比例裁决），Excel/WPS 导出的中文 CSV
  多是 GBK，按其超集 GB18030 解码；
- 分隔符：在开头若干条记录上试逗号、制表符、分号、竖线，取“多数记录字段数相同且多于一列”最一致的那个；
- 第一条非空记录是表头；行数以表格软件里的行号计（表头是第 1 行，带换行的引号字段仍算一行）；
- 上限：解码后的字符数与输出的字符数都按 RAG_INGEST_MAX_CHARS 检查（输出边生成边查）；列数、单个字段长度、
  行数超过下面的常量即永久失败，消息写明是哪个上限。引号没闭合的文件会把后面全部内容读进一个字段，
  由字段长度上限及时截住。
"""

from __future__ import annotations

import csv
import io
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from raglib.parsing.base import ParseError, Segment
from raglib.parsing.limits import LimitExceeded
from raglib.parsing.ocr_session import OcrSession
from raglib.parsing.text import decode_text

# 候选分隔符，按平手时的优先顺序
DELIMITERS = (",", "\t", ";", "|")
# 判定分隔符时看的样本：前这么多字符里的前这么多条记录
SNIFF_CHARS = 64 * 1024
SNIFF_RECORDS = 50
# 一组（一个片段）的目标字符数（含表头行与对齐行）；表头超过它的四分之一时，一组放大到表头的四倍
GROUP_CHARS = 300
# 列数、单个字段的字符数、数据行数的上限：超过即永久失败
MAX_COLUMNS = 1000
MAX_FIELD_CHARS = 131_072  # 与 Python csv 模块默认的 field_size_limit 相同（它是进程级设置，这里不改它）
MAX_ROWS = 1_000_000

_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_LINE_BREAKS = re.compile(r"\s*[\r\n]+\s*")


def sniff_delimiter(text: str) -> str:
    """在开头的若干条记录上试各候选分隔符，返回最一致的那个；都只有一列时返回逗号。"""
    sample = text[:SNIFF_CHARS]
    if len(text) > SNIFF_CHARS:
        # 样本末尾那条记录多半被截断了，不参与统计
        sample = sample[: sample.rfind("\n") + 1] or sample
    best: tuple[float, int, int] = (0.0, 1, 0)
    chosen = ","
    for rank, delimiter in enumerate(DELIMITERS):
        counts: list[int] = []
        try:
            for record in csv.reader(io.StringIO(sample), delimiter=delimiter):
                if any(field.strip() for field in record):
                    counts.append(len(record))
                if len(counts) >= SNIFF_RECORDS:
                    break
        except csv.Error:
            continue
        if not counts:
            continue
        columns, agreeing = Counter(counts).most_common(1)[0]
        if columns < 2:
            continue
        score = (agreeing / len(counts), columns, -rank)
        if score > best:
            best, chosen = score, delimiter
    return chosen


def _cell(value: str) -> str:
    """单元格文字放进 Markdown 表格：换行变空格、去控制字符、竖线转义。"""
    value = _CONTROL_CHARS.sub("", _LINE_BREAKS.sub(" ", value)).strip()
    return value.replace("|", "\\|")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _records(text: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """逐条读记录，返回 (表格软件里的行号, 字段)；字段过长（多半是引号没闭合）、列数过多即失败。"""
    reader = csv.reader(io.StringIO(text), delimiter=delimiter, strict=False)
    number = 0
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if "field larger than field limit" in str(exc):
                raise LimitExceeded(
                    f"Row {number + 1} of the CSV has a field longer than {MAX_FIELD_CHARS:,} characters, the limit "
                    "for one CSV field (probably a quote that is never closed)") from exc
            raise ParseError(f"The CSV could not be read at row {number + 1}: {exc}") from exc
        number += 1
        if len(record) > MAX_COLUMNS:
            raise LimitExceeded(
                f"Row {number} of the CSV has {len(record):,} fields, more than the limit of {MAX_COLUMNS:,} columns "
                "for one CSV")
        yield number, record


def parse_csv(path: Path, session: OcrSession) -> list[Segment]:
    """CSV：每组若干行一个片段，每个片段是 ``## 第 a 至 b 行`` + 表头行 + 对齐行 + 这几行的 Markdown 表格。"""
    decoded = decode_text(path.read_bytes())
    # 解码后立即计数：超限的文件不再逐行解析
    session.limits.check_chars(len(decoded))
    # 统一换行：只有 \r 的老式换行会让 csv 模块在不带引号的字段里报错；引号内的换行反正会变成空格
    text = decoded.lstrip("\ufeff").replace("\x00", "").replace("\r\n", "\n").replace("\r", "\n")
    delimiter = sniff_delimiter(text)
    records = _records(text, delimiter)
    header: list[str] | None = None
    for _number, record in records:
        if any(field.strip() for field in record):
            header = [_cell(field) for field in record]
            break
    if header is None:
        return []
    columns = len(header)
    head = _row(header) + "\n" + _row(["---"] * columns)
    budget = max(GROUP_CHARS, 4 * len(head))
    segments: list[Segment] = []
    group: list[str] = []
    first = last = 0
    size = total = rows = 0

    def flush() -> None:
        nonlocal group, size, total
        body = "\n".join(group)
        rows_label = f"{first} 至 {last}" if first != last else str(first)
        segment = f"## 第 {rows_label} 行\n\n{head}\n{body}"
        total += len(segment) + 2
        # 输出边生成边查：表头重复不会让输出在检查之前就远超上限
        session.limits.check_chars(total)
        segments.append(Segment(text=segment))
        group, size = [], 0

    for number, record in records:
        if not any(field.strip() for field in record):
            continue
        rows += 1
        if rows > MAX_ROWS:
            raise LimitExceeded(f"The CSV has more than {MAX_ROWS:,} rows, the limit for one CSV; "
                                "split it into smaller files")
        cells = [_cell(field) for field in record]
        if len(cells) > columns:
            # 多出来的字段（多半是没加引号的逗号）并进最后一列，不丢内容
            joiner = "\\| " if delimiter == "|" else ("  " if delimiter == "\t" else f"{delimiter} ")
            cells = [*cells[: columns - 1], joiner.join(cells[columns - 1 :])]
        line = _row(cells + [""] * (columns - len(cells)))
        if group and size + len(line) + 1 > budget:
            flush()
        if not group:
            first, size = number, len(head)
        group.append(line)
        last = number
        size += len(line) + 1
    if group:
        flush()
    if not segments:
        # 只有表头：表头本身也是内容（列名），照样收进来
        segments.append(Segment(text=head))
    return segments
