"""全文段的词典：按词位排好序、切成块的 (词位, 段内 df, 倒排) 表，罕见词的倒排直接内联（纯函数，不碰数据库）。

一个段（``search.segments`` 合并 L0 写出的不可变倒排）在数据库里是两种行：

- 词典块 ``fulltext_dictionary``：约 ``DICTIONARY_BLOCK_BYTES`` 字节一行，存一段连续的词位（"C" 排序，即 UTF-8
  字节序）。找一个词 = 取 ``first_lexeme ≤ 它`` 的最后一行再在块里二分；前缀词 = 一段连续的行。
- 倒排块 ``fulltext_blocks``：段内 df 大的词，≤128 个倒排一行（格式见 :mod:`raglib.postings`），块号 0 影响力最高。

为什么内联：中文的字 bigram 词表很长，多数词只出现在一两个分块里（cmrc2018 的 1,318 个分块有 13.5 万个词位，
三分之二 df=1）。每词一行时，行头、主键与索引项约 100 字节，比倒排本身大十几倍；内联后一个罕见词约 20 字节
（Lucene 的 terms dictionary 也把极短的倒排内联进词典，“pulsing”）。

词典块的字节格式（小端）::

    u16 n | u32 L | L 字节词位（UTF-8，以 NUL 分隔：PostgreSQL 的 text 不会含 NUL）
    | u32 df[n] | u16 inline_len[n] | 内联倒排依次拼接

``inline_len`` 为 0 的词在倒排块表里，块数 = ceil(df / BLOCK_SIZE)。
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from raglib.postings import BLOCK_SIZE, Postings, build_blocks, decode_blocks

# 一个词的倒排编码后不超过这么多字节就内联进词典（约 20 个倒排）：再大就值得单独一行
INLINE_MAX_BYTES = 96
# 词典块的目标大小：PostgreSQL 的行超过约 2 KB 就要压缩或移出行外（TOAST），多一次读取
DICTIONARY_BLOCK_BYTES = 1800
_HEADER = struct.Struct("<HI")
_DF = struct.Struct("<I")
_LENGTH = struct.Struct("<H")


class Entry(NamedTuple):
    """词典里的一个词：段内 df，以及内联的倒排（``None`` 表示在倒排块表里）。

    NamedTuple 而不是 dataclass：查询里常用字的前缀词一次要取上千个条目，构造快三四倍。"""

    lexeme: str
    df: int
    inline: bytes | None

    @property
    def blocks(self) -> int:
        """倒排块表里的块数（内联的为 0）。"""
        return 0 if self.inline is not None else -(-self.df // BLOCK_SIZE)


@dataclass(frozen=True)
class SegmentRows:
    """一个段要写进数据库的行：词典块 (first_lexeme, data)、倒排块 (lexeme, block_no, data)
    与按首字汇总的 df (首字, df 之和)。"""

    dictionary: list[tuple[str, bytes]]
    blocks: list[tuple[str, int, bytes]]
    prefixes: list[tuple[str, int]]


def prefix_dfs(entries: Iterable[Entry]) -> list[tuple[str, int]]:
    """按首字汇总的 df：以每个字开头的各词位的段内 df 之和，按首字升序。

    查询里孤立的单字是前缀词（``'为':*``，见 :mod:`raglib.analysis`），它的 df 就是这个和。常用字开头的词位有上千个，
    散在几十上百个词典块里；查询时为了一个 df 把它们全读出来解析，是全文一路最慢的那一截
    （bench/pages/fulltext_engine.md），而这样的词多半因为太常见根本不读倒排（``raglib.bm25.allot_postings``）。
    段写出时算好，查询只查一行。
    """
    sums: dict[str, int] = {}
    for entry in entries:
        sums[entry.lexeme[0]] = sums.get(entry.lexeme[0], 0) + entry.df
    return sorted(sums.items())


def _encode_block(entries: Sequence[Entry]) -> bytes:
    names = b"\x00".join(entry.lexeme.encode("utf-8") for entry in entries)
    inline = [entry.inline or b"" for entry in entries]
    return b"".join([
        _HEADER.pack(len(entries), len(names)), names,
        np.array([entry.df for entry in entries], dtype="<u4").tobytes(),
        np.array([len(data) for data in inline], dtype="<u2").tobytes(),
        *inline,
    ])


def encode_dictionary(entries: Iterable[Entry]) -> list[tuple[str, bytes]]:
    """按词位排好序的词切成词典块：每块到 ``DICTIONARY_BLOCK_BYTES`` 左右就开新块。"""
    blocks: list[tuple[str, bytes]] = []
    current: list[Entry] = []
    size = 0
    for entry in entries:
        cost = len(entry.lexeme.encode("utf-8")) + 7 + len(entry.inline or b"")
        if current and size + cost > DICTIONARY_BLOCK_BYTES:
            blocks.append((current[0].lexeme, _encode_block(current)))
            current, size = [], 0
        current.append(entry)
        size += cost
    if current:
        blocks.append((current[0].lexeme, _encode_block(current)))
    return blocks


class DictionaryBlock:
    """一个词典块的读取器：查询时只取要的那几个词。

    词位表按字节切开、不解码（UTF-8 的字节序就是码点序，二分查找用编码后的词比较）；df 与内联倒排的位置按下标现取。
    一个查询要在每个段里各查一个块：6 个段、17 个查询词就是上百个块，整块解析（解码全部词位、转换全部 df 与长度）
    曾是多段知识库上最大的一截开销。
    """

    def __init__(self, data: bytes) -> None:
        n, names_length = _HEADER.unpack_from(data)
        names_at = _HEADER.size
        self._names = data[names_at:names_at + names_length].split(b"\x00")
        self._dfs_at = names_at + names_length
        self._lengths_at = self._dfs_at + 4 * n
        self._inline_at = self._lengths_at + 2 * n
        self._data = data
        self._starts: list[int] | None = None  # 各词内联倒排的起点，前缀查找要一串条目时才算

    def _entry(self, index: int, start: int) -> Entry:
        data = self._data
        (df,) = _DF.unpack_from(data, self._dfs_at + 4 * index)
        (length,) = _LENGTH.unpack_from(data, self._lengths_at + 2 * index)
        return Entry(self._names[index].decode("utf-8"), df, data[start:start + length] if length else None)

    def entry(self, index: int) -> Entry:
        if self._starts is None:
            lengths = np.frombuffer(self._data, dtype="<u2", count=len(self._names), offset=self._lengths_at)
            self._starts = (self._inline_at + np.cumsum(lengths) - lengths).tolist()
        return self._entry(index, self._starts[index])

    def find(self, lexeme: str) -> Entry | None:
        """二分查找一个词（块内按词位升序）。"""
        key = lexeme.encode("utf-8")
        index = bisect.bisect_left(self._names, key)
        if index == len(self._names) or self._names[index] != key:
            return None
        if self._starts is not None:
            return self.entry(index)
        # 只取一个词：它前面各词的内联长度加起来就是它的起点，不必为整块算前缀和
        return self._entry(index, self._inline_at + sum(struct.unpack_from(f"<{index}H", self._data, self._lengths_at)))

    def with_prefix(self, prefix: str) -> list[Entry]:
        """块里以 ``prefix`` 开头的词（一段连续的位置）。"""
        key = prefix.encode("utf-8")
        start = bisect.bisect_left(self._names, key)
        end = bisect.bisect_left(self._names, key + b"\xff", lo=start)  # UTF-8 里不会出现 0xff
        return [self.entry(index) for index in range(start, end)]

    def entries(self) -> list[Entry]:
        return [self.entry(index) for index in range(len(self._names))]


def decode_dictionary_block(data: bytes) -> list[Entry]:
    """一个词典块里的全部词（按词位升序）。"""
    return DictionaryBlock(data).entries()


def build_segment(lexemes: Sequence[str], postings: Postings) -> SegmentRows:
    """一个段的行：``lexemes`` 按 "C" 序（UTF-8 字节序，也就是 Python 的字符串顺序）排好、互不相同，
    ``postings.terms`` 是其中的下标。

    每个词的倒排按 :func:`raglib.postings.build_blocks` 切块；只有一块且不超过 ``INLINE_MAX_BYTES`` 的内联进词典。
    """
    by_term: dict[int, list[tuple[int, bytes]]] = {}
    for block in build_blocks(postings):
        by_term.setdefault(block.term, []).append((block.number, block.data))
    counts = np.bincount(postings.terms, minlength=len(lexemes)) if len(postings) else np.zeros(len(lexemes), int)
    entries: list[Entry] = []
    rows: list[tuple[str, int, bytes]] = []
    for term, blocks in sorted(by_term.items()):
        lexeme = lexemes[term]
        if len(blocks) == 1 and len(blocks[0][1]) <= INLINE_MAX_BYTES:
            entries.append(Entry(lexeme, int(counts[term]), blocks[0][1]))
        else:
            entries.append(Entry(lexeme, int(counts[term]), None))
            rows.extend((lexeme, number, data) for number, data in blocks)
    return SegmentRows(encode_dictionary(entries), rows, prefix_dfs(entries))


def read_segment(dictionary: Iterable[bytes], blocks: Iterable[tuple[str, bytes]], *,
                 low: str | None = None, high: str | None = None) -> tuple[list[str], Postings]:
    """:func:`build_segment` 的逆：一个段的词典块与倒排块 (lexeme, data) → (词位表, 倒排)，合并时用。

    给了 ``low`` / ``high`` 时只要词位在 [low, high) 里的（并段按词位分片读，跨片边界的词典块两片都会读到）；
    ``blocks`` 应当已按同样的范围取好。
    """
    entries = [entry for data in dictionary for entry in decode_dictionary_block(data)
               if (low is None or entry.lexeme >= low) and (high is None or entry.lexeme < high)]
    # Python 的字符串按码点比较，与 UTF-8 字节序（"C" 排序规则）一致
    lexemes = sorted({entry.lexeme for entry in entries})
    index = {lexeme: i for i, lexeme in enumerate(lexemes)}
    pairs = [(index[entry.lexeme], entry.inline) for entry in entries if entry.inline is not None]
    pairs += [(index[lexeme], data) for lexeme, data in blocks]
    return lexemes, decode_blocks(pairs) if pairs else Postings.empty()
