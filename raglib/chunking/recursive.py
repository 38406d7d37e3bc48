"""递归字符分块（默认 1000 字符、重叠 200 字符；见 docs/INVARIANTS.md 的 RECURSIVE-SPLIT）。

与 LangChain ``RecursiveCharacterTextSplitter`` 的算法一致：依次尝试分隔符
``"\\n\\n" → "\\n" → "。" → "！" → "？" → "；" → "." → " " → ""``，用文本中出现的第一个分隔符切开；
不短于 ``chunk_size`` 的片段用后面的分隔符递归再切；短片段按顺序贪心合并成 ≤ ``chunk_size`` 字符的块，
换块时从上一块末尾保留总长 ≤ ``overlap`` 的若干片段作为重叠。

与 LangChain 的差异（均为有意为之）：
- 全程只操作 ``(start, end)`` 区间，块文本就是原文切片，偏移精确；
- 分隔符留在**前一段末尾**（LangChain 默认放在后一段开头），这样中文句末标点跟着自己的句子；
- 块首尾空白被裁掉（对应 LangChain 的 ``strip_whitespace=True``），长度按裁剪后计；
  裁剪后完全包含在上一块中的块（只剩重叠 + 空白）被丢弃。
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Final

from raglib.chunking._text import next_char_boundary, skip_space, trim_end

__all__ = ["DEFAULT_SEPARATORS", "recursive_split"]

DEFAULT_SEPARATORS: Final[tuple[str, ...]] = ("\n\n", "\n", "。", "！", "？", "；", ".", " ", "")


def recursive_split(
    text: str,
    chunk_size: int,
    overlap: int,
    separators: Sequence[str] = DEFAULT_SEPARATORS,
) -> list[tuple[int, int]]:
    """返回块区间（已去首尾空白，``len(text[s:e]) <= chunk_size``），按文档顺序。"""
    if chunk_size <= 0 or not 0 <= overlap < chunk_size:
        raise ValueError(f"need chunk_size > 0 and 0 <= overlap < chunk_size, got {chunk_size}/{overlap}")
    spans: list[tuple[int, int]] = []
    # 先去掉全文首尾空白：去空白后不超过 chunk_size 的内容整体一块（见 docs/INVARIANTS.md 的 RECURSIVE-SPLIT）
    first = skip_space(text, 0)
    _split(text, first, trim_end(text, first, len(text)), list(separators), chunk_size, overlap, spans)
    result: list[tuple[int, int]] = []
    for start, end in spans:
        lo = skip_space(text, start, end)
        hi = trim_end(text, lo, end)
        # 去掉空白后完全落在上一块里的块（只剩重叠部分 + 空白）不带新内容，丢弃
        if hi > lo and (not result or hi > result[-1][1]):
            result.append((lo, hi))
    return result


def _pieces(text: str, start: int, end: int, separator: str) -> Iterator[tuple[int, int]]:
    """按分隔符把 ``[start, end)`` 切成相邻片段，分隔符留在前一段末尾。

    逐个产出而不是先建列表：一行 10 MB 的文本按空格或逐字切开就是上百万个片段，
    列表要占几百 MB；合并只需要当前块的那几个片段。
    """
    if separator == "":
        # 逐"字符"切：不把组合附加符号、ZWJ emoji 序列拆开
        pos = start
        while pos < end:
            nxt = next_char_boundary(text, pos, end)
            yield pos, nxt
            pos = nxt
        return
    pos = start
    width = len(separator)
    while True:
        found = text.find(separator, pos, end)
        if found < 0:
            break
        yield pos, found + width
        pos = found + width
    if pos < end:
        yield pos, end


def _split(
    text: str,
    start: int,
    end: int,
    separators: list[str],
    chunk_size: int,
    overlap: int,
    out: list[tuple[int, int]],
) -> None:
    separator = separators[-1]
    rest: list[str] = []
    for index, candidate in enumerate(separators):
        if candidate == "":
            separator = candidate
            break
        if text.find(candidate, start, end) >= 0:
            separator = candidate
            rest = separators[index + 1 :]
            break
    merger = _Merger(chunk_size, overlap, out)
    for piece in _pieces(text, start, end, separator):
        if piece[1] - piece[0] < chunk_size:
            merger.add(piece)
            continue
        merger.flush()
        if rest:
            _split(text, piece[0], piece[1], rest, chunk_size, overlap, out)
        else:
            out.append(piece)
    merger.flush()


class _Merger:
    """LangChain ``_merge_splits`` 的区间版、逐片段进行：片段相邻，所以块区间 = 首片段起点到末片段终点。

    连续的一串短片段依次 ``add``，遇到长片段或结束时 ``flush``；只保留当前块的片段。
    """

    def __init__(self, chunk_size: int, overlap: int, out: list[tuple[int, int]]) -> None:
        self.chunk_size = chunk_size
        self.overlap = overlap
        self.out = out
        self.current: deque[tuple[int, int]] = deque()
        self.total = 0

    def add(self, piece: tuple[int, int]) -> None:
        length = piece[1] - piece[0]
        current = self.current
        if self.total + length > self.chunk_size and current:
            self.out.append((current[0][0], current[-1][1]))
            while self.total > self.overlap or (self.total + length > self.chunk_size and self.total > 0):
                first = current.popleft()
                self.total -= first[1] - first[0]
        current.append(piece)
        self.total += length

    def flush(self) -> None:
        if self.current:
            self.out.append((self.current[0][0], self.current[-1][1]))
        self.current.clear()
        self.total = 0
