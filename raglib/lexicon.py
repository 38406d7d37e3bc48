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

存进数据库的是这段字节的 zlib 压缩，前面加一个字节 ``0xFF``（:func:`pack_dictionary_block`）。词典是小库全文索引里
最大的一张表（cmrc2018 + squad 的 1,704 个分块 3.7 MB，2.2 KB/块），而它很好压：多数 df 是 1（u32 的高三个字节全是 0），
相邻词位共用首字的 UTF-8 字节。PostgreSQL 自己不压它：行不到 2 KB 不试，调低 ``toast_tuple_target`` 试了也放弃
（pglz 在前 1 KB 里找不到重复就不压，实测一行都没压）。未压缩的旧块照样能读：它以 u16 n 开头，而一块至多
``DICTIONARY_BLOCK_BYTES / 8`` 个词（每词至少 8 字节），n < 255，首字节不会是 ``0xFF``；段被合并时改写成压缩的。
"""

from __future__ import annotations

import bisect
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from raglib.postings import BLOCK_SIZE, NormLookup, Postings, decode_joined, encode_blocks, first_of_runs

# 一个词的倒排编码后不超过这么多字节就内联进词典（约 20 个倒排）：再大就值得单独一行
INLINE_MAX_BYTES = 96
# 词典块（未压缩）的目标大小。压缩后约一半；再大的块查一个词要解析的也更多（查询逐块解析，见 DictionaryBlock）
DICTIONARY_BLOCK_BYTES = 1800
# 压缩块的标记（见模块说明）与 zlib 级别：6 比 1 再小 7%，合并时压缩约 20 MB/s，解压一块约 10 微秒
PACKED = 0xFF
_PACKED_PREFIX = bytes([PACKED])
_ZLIB_LEVEL = 6
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


def prefix_dfs(lexemes: Sequence[str], dfs: Sequence[int] | np.ndarray) -> list[tuple[str, int]]:
    """按首字汇总的 df：以每个字开头的各词位的段内 df 之和，按首字升序。``lexemes`` 须已按词位升序排好
    （同首字的词位因此相邻，一次分段求和）。

    查询里孤立的单字是前缀词（``'为':*``，见 :mod:`raglib.analysis`），它的 df 就是这个和。常用字开头的词位有上千个，
    散在几十上百个词典块里；查询时为了一个 df 把它们全读出来解析，是全文一路最慢的那一截
    （bench/pages/fulltext_engine.md），而这样的词多半因为太常见根本不读倒排（``raglib.bm25.allot_postings``）。
    段写出时算好，查询只查一行。
    """
    if not lexemes:
        return []
    firsts = [lexeme[0] for lexeme in lexemes]
    codes = np.fromiter(map(ord, firsts), dtype=np.int64, count=len(firsts))
    if np.any(codes[1:] < codes[:-1]):
        raise ValueError("词位须按升序排好")
    starts = first_of_runs(codes)
    sums = np.add.reduceat(np.asarray(dfs, dtype=np.int64), starts)
    return [(firsts[start], total) for start, total in zip(starts.tolist(), sums.tolist(), strict=True)]


def pack_dictionary_block(plain: bytes) -> bytes:
    """词典块存进数据库的样子：``0xFF`` + zlib 压缩。"""
    if plain[0] == PACKED:
        raise ValueError("词典块的词数不能让首字节是 0xFF（会被当成压缩块）")
    return _PACKED_PREFIX + zlib.compress(plain, _ZLIB_LEVEL)


def unpack_dictionary_block(stored: bytes) -> bytes:
    """数据库里的词典块 → 未压缩的字节：压缩的解压，旧的未压缩块原样返回。"""
    return zlib.decompress(stored[1:]) if stored.startswith(_PACKED_PREFIX) else stored


def _encode_columns(lexemes: Sequence[str], dfs: np.ndarray, inline_lengths: np.ndarray,
                    inline: bytes) -> list[tuple[str, bytes]]:
    """按词位排好序的词（按列：词位、df、各词内联倒排的字节数，与按同一顺序首尾相接的内联倒排）切成词典块：
    每块到 ``DICTIONARY_BLOCK_BYTES`` 左右就开新块。

    一个块的 df、长度与内联倒排都是整列里连续的一段，直接切片拼接：合并一个段要写上百万个词，逐词构造、逐块
    打包曾占合并时间的一半。"""
    encoded = [lexeme.encode("utf-8") for lexeme in lexemes]
    inline_lengths = np.asarray(inline_lengths, dtype=np.int64)
    if inline_lengths.size and inline_lengths.max() > 0xFFFF:
        raise ValueError("内联倒排超过 65535 字节")
    costs = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)) + 7 + inline_lengths
    bounds = np.r_[0, np.cumsum(costs)].tolist()
    inline_at = np.r_[0, np.cumsum(inline_lengths)].tolist()
    df_bytes = np.asarray(dfs, dtype="<u4").tobytes()
    length_bytes = inline_lengths.astype("<u2").tobytes()
    blocks: list[tuple[str, bytes]] = []
    start = 0
    while start < len(encoded):
        # 一块收下累计字节不超过上限的最长一段（至少一个词）：与逐词累加、超了就开新块相同
        end = max(start + 1, bisect.bisect_right(bounds, bounds[start] + DICTIONARY_BLOCK_BYTES) - 1)
        names = b"\x00".join(encoded[start:end])
        blocks.append((lexemes[start], pack_dictionary_block(b"".join([
            _HEADER.pack(end - start, len(names)), names, df_bytes[4 * start:4 * end],
            length_bytes[2 * start:2 * end], inline[inline_at[start]:inline_at[end]],
        ]))))
        start = end
    return blocks


def encode_dictionary(entries: Iterable[Entry]) -> list[tuple[str, bytes]]:
    """按词位排好序的词切成词典块：每块到 ``DICTIONARY_BLOCK_BYTES`` 左右就开新块。"""
    entries = list(entries)
    inline = [entry.inline or b"" for entry in entries]
    return _encode_columns([entry.lexeme for entry in entries],
                           np.array([entry.df for entry in entries], dtype=np.int64),
                           np.fromiter(map(len, inline), dtype=np.int64, count=len(inline)), b"".join(inline))


class DictionaryBlock:
    """一个词典块的读取器：查询时只取要的那几个词。

    词位表按字节切开、不解码（UTF-8 的字节序就是码点序，二分查找用编码后的词比较）；df 与内联倒排的位置按下标现取。
    一个查询要在每个段里各查一个块：6 个段、17 个查询词就是上百个块，整块解析（解码全部词位、转换全部 df 与长度）
    曾是多段知识库上最大的一截开销。
    """

    def __init__(self, data: bytes) -> None:
        data = unpack_dictionary_block(data)
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

    每个词的倒排按 :func:`raglib.postings.encode_blocks` 切块；只有一块且不超过 ``INLINE_MAX_BYTES`` 的内联进词典。
    块里没有长度字节：段按序号存的那一份由调用方与这些行一起写（``fulltext_segments.norms``）。
    """
    encoded = encode_blocks(postings)
    if not len(encoded):
        return SegmentRows([], [], [])
    # 块按 (词, 块号) 排好：每个词的第一块是一段的起点
    firsts = first_of_runs(encoded.terms)
    terms = encoded.terms[firsts]
    block_counts = np.diff(np.r_[firsts, len(encoded)])
    inline = (block_counts == 1) & (encoded.sizes[firsts] <= INLINE_MAX_BYTES)
    inline_blocks = np.zeros(len(encoded), dtype=bool)
    inline_blocks[firsts[inline]] = True
    names = [lexemes[term] for term in terms.tolist()]
    dfs = np.bincount(postings.terms, minlength=len(lexemes))[terms]
    # 内联的块在 raw 里按词的顺序排着：按字节掩码取出就是词典要的首尾相接的内联倒排
    dictionary = _encode_columns(names, dfs, np.where(inline, encoded.sizes[firsts], 0),
                                 encoded.raw[np.repeat(inline_blocks, encoded.sizes)].tobytes())
    raw = encoded.raw.tobytes()
    separate = np.flatnonzero(~inline_blocks)
    starts = encoded.offsets[separate].tolist()
    rows = [(lexemes[term], number, raw[start:start + size]) for term, number, start, size in zip(
        encoded.terms[separate].tolist(), encoded.numbers[separate].tolist(), starts,
        encoded.sizes[separate].tolist(), strict=True)]
    return SegmentRows(dictionary, rows, prefix_dfs(names, dfs))


def read_segment(dictionary: Iterable[bytes], blocks: Iterable[tuple[str, bytes]], *,
                 low: str | None = None, high: str | None = None,
                 norms: NormLookup | None = None) -> tuple[list[str], Postings]:
    """:func:`build_segment` 的逆：一个段的词典块与倒排块 (lexeme, data) → (词位表, 倒排)，合并时用。
    ``norms`` 是这个段按序号存的长度字节（:func:`raglib.postings.dense_norms`；块里自带长度字节的旧段不用给）。

    给了 ``low`` / ``high`` 时只要词位在 [low, high) 里的（并段按词位分片读，跨片边界的词典块两片都会读到）；
    ``blocks`` 应当已按同样的范围取好。词典块按列读：词位表整块解码一次，内联倒排整段切下（它们在块里本来就
    首尾相接），不为每个词构造条目。
    """
    # 词典块的词位范围互不相交：按首词排好，词位表就是升序的（取出的行不保证顺序）
    parts = sorted((_dictionary_columns(data) for data in dictionary), key=lambda part: part[0][0])
    lexemes: list[str] = []
    joined: list[bytes] = []
    lengths: list[np.ndarray] = []
    terms: list[np.ndarray] = []
    for names, inline_lengths, inline in parts:
        first = bisect.bisect_left(names, low) if low is not None else 0
        last = bisect.bisect_left(names, high) if high is not None else len(names)
        taken = inline_lengths[first:last]
        at = int(inline_lengths[:first].sum())
        joined.append(inline[at:at + int(taken.sum())])
        lengths.append(taken[taken > 0])
        terms.append(len(lexemes) + np.flatnonzero(taken > 0))
        lexemes += names[first:last]
    # 倒排块表里的词（段内 df 大的）都在词典里：在排好的词位表里二分找下标
    block_terms: list[int] = []
    for lexeme, data in blocks:
        index = bisect.bisect_left(lexemes, lexeme)
        if index == len(lexemes) or lexemes[index] != lexeme:
            raise ValueError(f"倒排块的词 {lexeme!r} 不在词典里")
        joined.append(data)
        block_terms.append(index)
    lengths.append(np.fromiter(map(len, joined[len(parts):]), dtype=np.int64, count=len(block_terms)))
    terms.append(np.array(block_terms, dtype=np.int64))
    return lexemes, decode_joined(b"".join(joined), np.concatenate(lengths), np.concatenate(terms), norms)


def _dictionary_columns(data: bytes) -> tuple[list[str], np.ndarray, bytes]:
    """一个词典块的 (词位表, 各词内联倒排的字节数, 首尾相接的内联倒排)。"""
    data = unpack_dictionary_block(data)
    n, names_length = _HEADER.unpack_from(data)
    names_end = _HEADER.size + names_length
    names = data[_HEADER.size:names_end].decode("utf-8").split("\x00")
    inline_lengths = np.frombuffer(data, dtype="<u2", count=n, offset=names_end + 4 * n).astype(np.int64)
    return names, inline_lengths, data[names_end + 6 * n:]
