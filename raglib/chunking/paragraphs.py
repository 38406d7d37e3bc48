"""按段落分块（``paragraph`` 策略，知识条目的默认）：块从不跨越段落。

为什么：知识条目由 Agent 按段落增量修改。跨段落贪心打包的分块器（recursive、token）里，改一段——尤其是改变了它的长度——
会让后面所有块的边界一起移动，整篇条目重新向量化（一段改短了，6 块里有 4 块要重算，还得排队）。这里每段
（空行分隔）单独成块，只由那一段的内容决定：改一段只重算那一段的块，其余块的文本不变，向量按文本摘要复用。

- 只有标题行的段落（``# 付款方式``）并进它下面那一段：标题单独成块既检索不到什么，也让正文块丢了标题；
- 超过 ``chunk_size`` 字符的段落在段内用递归字符分块（``recursive_split``，带 ``overlap``）再切；
- 块文本就是原文切片（首尾空白已去掉），偏移精确。
"""

from __future__ import annotations

import re

from raglib.chunking._text import skip_space, trim_end
from raglib.chunking.recursive import recursive_split

__all__ = ["paragraph_spans"]

_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
_HEADING_ONLY = re.compile(r"(?:[ \t]*#{1,6}[ \t][^\n]*(?:\n|$))+")


def _paragraphs(text: str) -> list[tuple[int, int]]:
    """空行分隔的段落区间（已去首尾空白）；标题行单独成段时并进下一段。"""
    spans: list[tuple[int, int]] = []
    position = 0
    for match in [*_BLANK_LINE.finditer(text), None]:
        end = match.start() if match else len(text)
        start = skip_space(text, position, end)
        stop = trim_end(text, start, end)
        if stop > start:
            spans.append((start, stop))
        position = match.end() if match else len(text)
    merged: list[tuple[int, int]] = []
    pending: int | None = None
    for start, end in spans:
        if _HEADING_ONLY.fullmatch(text[start:end]):
            pending = start if pending is None else pending
            continue
        merged.append((start if pending is None else pending, end))
        pending = None
    if pending is not None:  # 结尾只剩标题：自成一块
        merged.append((pending, spans[-1][1]))
    return merged


def paragraph_spans(text: str, chunk_size: int, overlap: int) -> list[tuple[int, int]]:
    """块区间（按文档顺序，``len(text[s:e]) <= chunk_size``）：每段一块，过长的段在段内再切。"""
    if chunk_size <= 0 or not 0 <= overlap < chunk_size:
        raise ValueError(f"need chunk_size > 0 and 0 <= overlap < chunk_size, got {chunk_size}/{overlap}")
    spans: list[tuple[int, int]] = []
    for start, end in _paragraphs(text):
        if end - start <= chunk_size:
            spans.append((start, end))
        else:
            spans.extend((start + s, start + e) for s, e in recursive_split(text[start:end], chunk_size, overlap))
    return spans
