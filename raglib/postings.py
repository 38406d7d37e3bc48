"""全文倒排的块存储与 BM25 打分内核（纯 numpy，不碰数据库）：仿 Lucene 的压缩块倒排。

原来每条倒排是 PostgreSQL 里的一行（每个分块约 30 KB）；这里把同一个词的倒排按 ``BLOCK_SIZE`` 条
打成一个块，一块一行。这一层只管编码、解码与打分，读写哪张表由上面的应用层决定。

词频与长度
    标题、正文词频各占一个字节，超过 ``TF_MAX`` 的截到 ``TF_MAX``：BM25 的词频饱和项在 255 处早已平了。
    分块长度按 Lucene ``SmallFloat.intToByte4`` 量化成一个字节（24 以下精确，以上 3 位尾数，偏低不超过
    12.5%）：长度只进 BM25 的长度归一项，这点误差对排序无关紧要，一个字节却省下大半空间。打分与影响力
    都用解码后的长度 ``NORM_LENGTHS[norm]``，所以只凭存下来的数据就能重算出同样的值。

影响力与块的顺序
    ``impacts`` 与 ``search/sql/fulltext_impact.v1.sql`` 同一个公式，但作用在存下来的值上（截断后的词频、
    解码后的长度），合并时才能原样重算。每个词的倒排按影响力降序（同影响力按 doc 升序，结果确定）切块：
    0 号块是影响力最高的那一段，``max_impact`` 随块号不增。常见词截断读取时按块号从小往大读，
    先读到的就是贡献最大的倒排。

块数据格式（落盘格式：能读的旧块永远要能读，新的写法只能加标志位）::

    1 字节  块头：低 3 位是宽度 w（1、2 或 4：每个 doc 差值占几个字节），0x40 = 没有标题词频一节，
            0x20 = 没有正文词频一节，0x10 = 没有长度字节一节（长度按 doc 存在段里），
            0x80 = 差值按位打包（这时低 3 位为 0）
    4 字节  第一个 doc，uint32 小端
    （只有 0x80）1 字节 count-1、1 字节位数 b（1~32）
    差值区  相邻 doc 的差值 doc[i]-doc[i-1]：按字节时 (count-1)·w 字节，各 w 字节小端，w 取装得下最大差值的
            最小者；按位打包时 ⌈(count-1)·b/8⌉ 字节，第 i 个差值占第 [(i-1)·b, i·b) 位（小端位序），b 取装得下
            最大差值的最小位数
    count 字节  标题词频（块里全是 0 时省掉，块头记 0x40）
    count 字节  正文词频（块里全是 1 时省掉，块头记 0x20）
    count 字节  长度字节（norm；块头记 0x10 时没有这一节）

块内按 doc 升序存，差值因此为正且通常很小：宽度为 1 时每条倒排只占 2~4 个字节。两个标志是 2026-11-29 加的：
10 万块的合成库里 98.9% 的块没有一条标题词频、94% 的块正文词频全是 1（字 bigram 在一个分块里多半只出现一次），
省下块数据的 37%；以前写的块块头就是宽度（两位标志都是 0），照旧按三节读。count 不单独存：有 s 节时
数据长度 ``len = 5 + (count-1)·w + s·count``，已知块头时 ``count = (len - 5 + w) / (w + s)`` 唯一确定，
解码时校验整除。doc 必须在 [0, 2^32) 内（实际是知识库里压实后的分块序号，小于 2^31）。

长度字节按 doc 存一份（0x10，2026-11-30 起的写法）
    同一个分块的长度字节在它的每条倒排里都一样：10 万块的库里一个分块约有 150 条倒排在块里，每条重复一次
    长度。新写的块不带这一节，长度由段按序号存一份（``fulltext_segments.norms``，一个分块一字节），解码时
    由调用方给出 :data:`NormLookup`（doc → 长度字节）。以前写的块（没有 0x10）照旧从块里读。

差值按位打包（0x80，2026-11-30 起的写法，Lucene 的做法）
    常见词的块里 doc 很密，差值多半只要几位，按字节存一字节里空着一半以上。一块按位打包比按字节省、连多出的两字节
    块头（条数、位数：差值区的字节数推不出条数）也省得下时才打包；10 万块的合成库里 95% 的块打包，块数据少约两成。
    解码时有打包的块就把全部块的差值一起按位读（按字节存的块当作 8·w 位），一次查询两万条倒排多十几微秒。
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

BLOCK_SIZE = 128
TF_MAX = 255

_FREE_VALUES = 24  # Lucene 的 NUM_FREE_VALUES = 255 - longToInt4(Integer.MAX_VALUE)
_MAX_LENGTH = 2**31 - 1  # Lucene 的长度是 int，更大的值按它计
_HEADER = 5  # 块头 1 字节 + 第一个 doc 4 字节
_WIDTH_BITS = 0x07
_NO_TITLE = 0x40  # 块里的标题词频全是 0：不存这一节
_BODY_ONES = 0x20  # 块里的正文词频全是 1：不存这一节
_DOC_NORMS = 0x10  # 不存长度字节：按 doc 取自段（NormLookup）
_BIT_PACKED = 0x80  # 差值按位打包：块头低 3 位为 0，第一个 doc 之后是条数 - 1 与位数各一字节
_PACKED_EXTRA = 2  # 按位打包的块多出的块头字节（条数 - 1、位数）
_FLAGS = _WIDTH_BITS | _NO_TITLE | _BODY_ONES | _DOC_NORMS | _BIT_PACKED
_POWERS = 2 ** np.arange(33, dtype=np.int64)  # 装得下 x 的最小位数 = searchsorted(_POWERS, x, "right")
_WIDTH_MASKS = np.array([0, 0xFF, 0xFFFF, 0, 0xFFFFFFFF], dtype=np.uint32)  # 按差值宽度取低几个字节


def _byte4_to_int(codes: np.ndarray) -> np.ndarray:
    """Lucene ``SmallFloat.byte4ToInt`` 的向量版：24 以下原样，以上是 24 + int4ToLong(code - 24)。"""
    rel = codes - _FREE_VALUES
    bits = rel & 0x07
    shift = (rel >> 3) - 1
    normal = (bits | 0x08) << np.maximum(shift, 0)
    decoded = np.where(shift < 0, bits, normal) + _FREE_VALUES
    return np.where(codes < _FREE_VALUES, codes, decoded)


_NORM_INTS = _byte4_to_int(np.arange(256, dtype=np.int64))
NORM_LENGTHS: np.ndarray = _NORM_INTS.astype(np.float64)
NORM_LENGTHS.flags.writeable = False
_NORM_INTS.flags.writeable = False


def norm_bytes(lengths: np.ndarray) -> np.ndarray:
    """长度量化成一个字节（Lucene ``SmallFloat.intToByte4``）；负数按 0 计。

    intToByte4 是截断：编码就是解码值不超过长度的最大字节，而 ``NORM_LENGTHS`` 严格递增，
    所以二分查找与 Lucene 的位运算逐值相同（测试里与逐位移植的版本对照）。
    """
    values = np.clip(np.asarray(lengths, dtype=np.int64), 0, _MAX_LENGTH).astype(np.float64)
    return (np.searchsorted(NORM_LENGTHS, values, side="right") - 1).astype(np.uint8)


def quantised_length(length: int) -> float:
    """一个长度量化再解码后的值：打分实际用到的长度。"""
    return float(NORM_LENGTHS[norm_bytes(np.array([length]))[0]])


def capped_tf(tf: int) -> int:
    """一个字节存得下的词频：负数按 0，超过 ``TF_MAX`` 的截断。"""
    return min(max(tf, 0), TF_MAX)


def _impact_table() -> np.ndarray:
    """全部 (tfw, 长度字节) 组合的影响力：tfw = 2·标题 + 正文 ≤ 765，长度字节 256 种，一共不到 20 万个。

    ``32767·tfw / (tfw + 0.9·(0.6 + 0.4·len/256))`` 上下同乘 25600 化成整数除法：浮点在恰好落在整数上的
    分界处会差 1（例如 tfw=81、len=0 得 32549.99…），整数算法与 SQL 的 numeric 一样精确，且与平台无关。
    先算成表再查：int64 除法没有向量指令，千万条倒排逐条除要几秒，查表是一次 gather。
    """
    tfw = np.arange(3 * TF_MAX + 1, dtype=np.int64)[:, None]
    table = (32767 * 25600 * tfw) // (25600 * tfw + 13824 + 36 * _NORM_INTS[None, :])
    return table.astype(np.int16).ravel()


_IMPACTS = _impact_table()


def impacts(title_tf: np.ndarray, body_tf: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """每条倒排的影响力（int16）：v1 SQL 的公式，k1=0.9、b=0.4、L=256 写死（理由见那个文件）。

    只决定截断读取时先读谁，不参与打分；算在存下来的值上（词频截到 ``TF_MAX``、长度取解码值），
    合并块时才能原样重算。
    """
    title, body = np.asarray(title_tf), np.asarray(body_tf)
    # 倒排里存的本来就是一个字节（Postings 的 uint8 字段），不必再截：查询截断读取时每次要算两万条
    title = (title if title.dtype == np.uint8 else np.clip(title, 0, TF_MAX)).astype(np.int32)
    body = (body if body.dtype == np.uint8 else np.clip(body, 0, TF_MAX)).astype(np.int32)
    return _IMPACTS[(2 * title + body) * 256 + np.asarray(norms, dtype=np.uint8)]


def _as_dtype(values: Any, dtype: type[np.integer[Any]], name: str) -> np.ndarray:
    """按字段的类型收下数组；换类型时先查范围，免得 astype 悄悄回绕（比如 300 变成 44）。"""
    array = np.asarray(values)
    if array.dtype == dtype:
        return array
    if array.size and array.dtype.kind in "iub":
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise ValueError(f"{name} 超出 {np.dtype(dtype).name} 的范围")
    elif array.size:
        raise ValueError(f"{name} 必须是整数数组，实际是 {array.dtype}")
    return array.astype(dtype)


_FIELD_DTYPES: dict[str, type[np.integer[Any]]] = {
    "terms": np.int32, "docs": np.int64, "title_tf": np.uint8, "body_tf": np.uint8, "norms": np.uint8}


@dataclass(frozen=True)
class Postings:
    """一组倒排，拍平成等长数组，每条倒排各占一个下标：(词, doc, 标题词频, 正文词频, 长度字节)。

    构造时把各数组转成字段注释里的类型（数据库读出的常是 int64）；值装不下就报错而不是回绕，
    所以词频要先用 ``capped_tf`` 或 ``np.minimum(tf, TF_MAX)`` 截断，长度先用 ``norm_bytes`` 量化。
    """

    terms: np.ndarray  # int32
    docs: np.ndarray  # int64
    title_tf: np.ndarray  # uint8
    body_tf: np.ndarray  # uint8
    norms: np.ndarray  # uint8

    def __post_init__(self) -> None:
        for name, dtype in _FIELD_DTYPES.items():
            object.__setattr__(self, name, _as_dtype(getattr(self, name), dtype, name))
        if len({getattr(self, f.name).shape for f in fields(self)}) != 1 or self.terms.ndim != 1:
            raise ValueError("Postings 的各数组必须是等长的一维数组")

    @classmethod
    def empty(cls) -> Postings:
        return cls(*(np.empty(0, dtype) for dtype in _FIELD_DTYPES.values()))

    @classmethod
    def concat(cls, parts: Sequence[Postings]) -> Postings:
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))

    def __len__(self) -> int:
        return int(self.terms.shape[0])

    def select(self, keep: np.ndarray) -> Postings:
        """按布尔掩码或下标取出一部分倒排。"""
        return Postings(*(getattr(self, f.name)[keep] for f in fields(self)))

    def without_docs(self, docs: np.ndarray) -> Postings:
        """去掉这些 doc 的倒排（删除或重建分块时，旧块里它们的倒排要剔除）。"""
        return self.select(~np.isin(self.docs, docs)) if len(docs) else self

    def only_terms(self, terms: np.ndarray) -> Postings:
        return self.select(np.isin(self.terms, terms))


# doc（int64 数组）→ 它们的长度字节（uint8，同样长）：解码不带长度字节的块时由调用方给出
NormLookup = Callable[[np.ndarray], np.ndarray]


def dense_norms(first: int, values: np.ndarray) -> NormLookup:
    """一段连续序号 [first, first + len(values)) 的长度字节（一个段的 ``norms``，或相邻几个段的拼在一起）。
    查不在范围里的 doc 是数据错了（块里的 doc 不属于这个段），报错而不是读到别处。"""
    values = np.asarray(values, dtype=np.uint8)

    def lookup(docs: np.ndarray) -> np.ndarray:
        index = np.asarray(docs, dtype=np.int64) - first
        if index.size and (int(index.min()) < 0 or int(index.max()) >= values.size):
            raise ValueError("块数据损坏：doc 不在段的序号范围里，没有它的长度字节")
        return values[index]

    return lookup


def first_of_runs(values: np.ndarray) -> np.ndarray:
    """有序数组里每一段相同值的起点下标。"""
    return np.flatnonzero(np.r_[True, values[1:] != values[:-1]])


@dataclass(frozen=True)
class EncodedBlocks:
    """:func:`encode_blocks` 的结果，按列存：第 i 块是词 ``terms[i]`` 的 ``numbers[i]`` 号块，数据是
    ``raw[offsets[i]:offsets[i] + sizes[i]]``，各块按 (词, 块号) 排好、在 ``raw`` 里首尾相接。

    合并一个段要编几十万到上百万块（罕见词一词一块），每块一个 Python 对象时光是构造就占了合并时间的一成多；
    段的写出（:func:`raglib.lexicon.build_segment`）直接在这几列上切片。"""

    terms: np.ndarray  # int64
    numbers: np.ndarray  # int64
    max_impacts: np.ndarray  # int64
    counts: np.ndarray  # int64
    offsets: np.ndarray  # int64
    sizes: np.ndarray  # int64
    raw: np.ndarray  # uint8

    def __len__(self) -> int:
        return int(self.terms.shape[0])


def encode_blocks(postings: Postings) -> EncodedBlocks:
    """把倒排打成块，按 (词, 块号) 排好。同一个 (词, doc) 出现两次是上游的错，直接报错。

    三次整体排序，没有逐条倒排的 Python 循环：先按 (词, doc) 排并查重；再稳定地按 (词, 影响力降序)
    排，同影响力自然保持 doc 升序，按这个顺序每 ``BLOCK_SIZE`` 条切一块；最后按 (块, doc) 排出块内顺序。
    键都装得进 uint64：词减去最小值后不到 2^32，doc 与块序号也都不到 2^32；影响力非负，不到 2^15。
    都用稳定排序（timsort）：输入常常已是按词或按块排好的（合并旧块时），有序段越长排得越快。
    长度字节不进块（块头都记 0x10）：写段的一方按序号另存一份，解码时按 doc 查回来（:data:`NormLookup`）。
    """
    n = len(postings)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return EncodedBlocks(empty, empty, empty, empty, empty, empty, np.zeros(0, dtype=np.uint8))
    docs = postings.docs
    if docs.min() < 0 or docs.max() >= 2**32:
        raise ValueError("块里的 doc 必须在 [0, 2^32) 内")
    # 排序键都拼成 uint64，排好的键本身就带着词、doc 与影响力：后面直接从键里拆，少做几次乱序 gather
    # （千万级倒排时一次乱序 gather 要零点几秒，与排序本身同一量级）
    low = int(postings.terms.min())
    key = ((postings.terms.astype(np.int64) - low).astype(np.uint64) << np.uint64(32)) | docs.astype(np.uint64)
    order = np.argsort(key, kind="stable")
    key = key[order]  # (词, doc) 升序
    if np.any(key[1:] == key[:-1]):
        raise ValueError("同一个 (term, doc) 出现了不止一次")
    in_term = key >> np.uint64(32)
    docs = (key & np.uint64(0xFFFFFFFF)).astype(np.int64)
    imp = impacts(postings.title_tf, postings.body_tf, postings.norms)[order].astype(np.uint64)
    key = (in_term << np.uint64(16)) | (np.uint64(32767) - imp)
    del in_term, imp
    perm = np.argsort(key, kind="stable")  # 稳定排序：同影响力保持上一步的 doc 升序
    key, order, docs = key[perm], order[perm], docs[perm]
    del perm

    term_starts = first_of_runs(key >> np.uint64(16))
    rank = np.arange(n) - np.repeat(term_starts, np.diff(np.r_[term_starts, n]))  # 在本词里的名次
    opens_block = rank % BLOCK_SIZE == 0
    block_starts = np.flatnonzero(opens_block)
    block_terms = (key[block_starts] >> np.uint64(16)).astype(np.int64) + low
    block_numbers = rank[block_starts] // BLOCK_SIZE
    block_max = 32767 - (key[block_starts] & np.uint64(0xFFFF)).astype(np.int64)  # 每块第一条最高
    # 块内按 doc 升序：块序号在这个顺序里不减，重排只发生在各块内部，块的起点不变
    key = ((np.cumsum(opens_block) - 1).astype(np.uint64) << np.uint64(32)) | docs.astype(np.uint64)
    del rank, opens_block
    perm = np.argsort(key, kind="stable")
    order, docs = order[perm], docs[perm]
    del key, perm

    counts = np.diff(np.r_[block_starts, n])
    deltas = np.diff(docs, prepend=docs[0])
    deltas[block_starts] = 0
    widest = np.maximum.reduceat(deltas, block_starts)
    width = np.where(widest < 2**8, 1, np.where(widest < 2**16, 2, 4))
    # 按位打包：每个差值 bits 位（装得下块里最大差值的最小位数），只在连同多出的两字节块头仍比按字节省时用
    bits = np.searchsorted(_POWERS, widest, side="right").astype(np.int64)
    packed_bytes = ((counts - 1) * bits + 7) >> 3
    packed = packed_bytes + _PACKED_EXTRA < (counts - 1) * width
    width = np.where(packed, 0, width)
    header = _HEADER + _PACKED_EXTRA * packed
    delta_sizes = np.where(packed, packed_bytes, (counts - 1) * width)
    title, body = postings.title_tf[order], postings.body_tf[order]
    has_title = np.maximum.reduceat(title, block_starts) > 0
    has_body = (np.maximum.reduceat(body, block_starts) != 1) | (np.minimum.reduceat(body, block_starts) != 1)
    sizes = header + delta_sizes + (has_title.astype(np.int64) + has_body) * counts
    offsets = np.cumsum(sizes) - sizes
    buf = np.zeros(int(sizes.sum()), dtype=np.uint8)
    buf[offsets] = (np.where(packed, _BIT_PACKED, width) | np.where(has_title, 0, _NO_TITLE)
                    | np.where(has_body, 0, _BODY_ONES) | _DOC_NORMS)
    buf[offsets[:, None] + np.arange(1, 5)] = docs[block_starts].astype("<u4").view(np.uint8).reshape(-1, 4)
    buf[offsets[packed] + 5] = counts[packed] - 1
    buf[offsets[packed] + 6] = bits[packed]

    # 与解码一样，每块的量用 np.repeat 铺到各条倒排上，下标写成“块的基址 + 全局序号”
    index = np.arange(n)
    post_width = np.repeat(width, counts)
    delta_at = np.repeat(offsets + _HEADER - (block_starts + 1) * width, counts) + index * post_width
    delta_bytes = deltas.astype("<u4").view(np.uint8).reshape(-1, 4)
    for w in (1, 2, 4):
        chosen = np.flatnonzero(post_width == w)
        chosen = chosen[deltas[chosen] > 0]  # 块首没有差值（块内 doc 严格递增，其余差值都大于 0）
        for j in range(w):
            buf[delta_at[chosen] + j] = delta_bytes[chosen, j]
    if packed.any():
        _pack_deltas(buf, deltas, offsets, counts, block_starts, packed, bits)
    tf_at = np.repeat(offsets + header + delta_sizes - block_starts, counts) + index
    post_count = np.repeat(counts, counts)
    post_title, post_body = np.repeat(has_title, counts), np.repeat(has_body, counts)
    buf[tf_at[post_title]] = title[post_title]
    buf[(tf_at + post_title * post_count)[post_body]] = body[post_body]

    return EncodedBlocks(block_terms, block_numbers, block_max, counts, offsets, sizes.astype(np.int64), buf)


def _pack_deltas(buf: np.ndarray, deltas: np.ndarray, offsets: np.ndarray, counts: np.ndarray,
                 block_starts: np.ndarray, packed: np.ndarray, bits: np.ndarray) -> None:
    """按位打包的块里的差值写进 ``buf``：块内第 i 个差值（i 从 0 起，对应第 i+1 条倒排）占差值区的第
    [i·bits, (i+1)·bits) 位，小端位序。一个差值至多 32 位、起点在字节内偏 0~7 位，跨至多 5 个字节：逐字节按位或。"""
    chosen = np.flatnonzero(np.repeat(packed, counts))
    block = np.repeat(np.arange(len(counts)), counts)[chosen]
    rank = chosen - block_starts[block]
    chosen, block, rank = chosen[rank > 0], block[rank > 0], rank[rank > 0]
    at = (rank - 1) * bits[block]
    shifted = deltas[chosen].astype(np.uint64) << (at & 7).astype(np.uint64)
    first = offsets[block] + _HEADER + _PACKED_EXTRA + (at >> 3)
    for k in range(5):
        part = ((shifted >> np.uint64(8 * k)) & np.uint64(0xFF)).astype(np.uint8)
        some = np.flatnonzero(part)
        np.bitwise_or.at(buf, first[some] + k, part[some])


def decode_blocks(blocks: Sequence[tuple[int, bytes]], norms: NormLookup | None = None) -> Postings:
    """(词, 块数据) 解回拍平的倒排（块内按 doc 升序，块与块按传入顺序相接）。``norms`` 见 :func:`decode_joined`。

    所有块先拼成一个缓冲区，再对全部倒排一起做下标运算：逐块调用 numpy 的固定开销（每次几微秒）
    在一次查询读几百块时会比解码本身还贵。
    """
    if not blocks:
        return Postings.empty()
    datas = [data for _, data in blocks]
    return decode_joined(b"".join(datas), np.fromiter(map(len, datas), dtype=np.int64, count=len(datas)),
                         np.fromiter((term for term, _ in blocks), dtype=np.int32, count=len(blocks)), norms)


def decode_joined(joined: bytes, lengths: np.ndarray, terms: np.ndarray, norms: NormLookup | None = None) -> Postings:
    """首尾相接的一串块（第 i 块 ``lengths[i]`` 字节、属于词 ``terms[i]``）解回拍平的倒排。

    词典块里的内联倒排本来就首尾相接：合并读段时整段切下来交给这里，不必先拆成逐块的 bytes。
    不带长度字节的块（块头 0x10）按 doc 从 ``norms`` 查；有这样的块而没给 ``norms`` 时报错。"""
    if not len(lengths):
        return Postings.empty()
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(joined) != int(lengths.sum()) or len(terms) != len(lengths):
        raise ValueError("块数据损坏：各块长度之和与数据长度不符")
    # 末尾补 8 个零字节，下面按任意字节偏移读 uint32 / uint64 时不会越界
    buf = np.frombuffer(joined + bytes(8), dtype=np.uint8)
    # 每个字节偏移处起算的小端 uint32（不对齐的视图，不复制）：差值与第一个 doc 都一次取完
    words = np.ndarray((buf.size - 3,), dtype="<u4", buffer=buf, strides=(1,))
    offsets = np.cumsum(lengths) - lengths
    head = buf[offsets].astype(np.int64)
    width = head & _WIDTH_BITS
    has_title, has_body, has_norm = (head & _NO_TITLE) == 0, (head & _BODY_ONES) == 0, (head & _DOC_NORMS) == 0
    sections = has_norm.astype(np.int64) + has_title + has_body
    counts, rest = np.divmod(lengths - _HEADER + width, np.maximum(width + sections, 1))
    bad = ((width != 1) & (width != 2) & (width != 4)) | (rest != 0) | (lengths < _HEADER + sections)
    header, delta_sizes = _HEADER, (counts - 1) * width
    packed = (head & _BIT_PACKED) != 0
    bits = np.zeros(0, dtype=np.int64)
    if packed.any():  # 按位打包的块：条数与位数记在块头里（差值区的字节数推不出条数）
        counts = np.where(packed, buf[offsets + 5].astype(np.int64) + 1, counts)
        bits = buf[offsets + 6].astype(np.int64)
        header = _HEADER + _PACKED_EXTRA * packed
        delta_sizes = np.where(packed, ((counts - 1) * bits + 7) >> 3, delta_sizes)
        bad = np.where(packed, (width != 0) | (bits < 1) | (bits > 32)
                       | (lengths != header + delta_sizes + sections * counts), bad)
    if np.any(bad) or np.any(head & ~_FLAGS):
        raise ValueError("块数据损坏：块头或长度不对")
    if norms is None and not has_norm.all():
        raise ValueError("块的长度字节存在段里：解码要给出 norms")

    # 每块的量用 np.repeat 铺到各条倒排上（比按块下标 gather 便宜），下标都写成“块的基址 + 全局序号”
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    index = np.arange(total)
    if packed.any():
        deltas = _bit_deltas(buf, offsets, counts, starts, index, np.where(packed, bits, 8 * width), header)
    else:
        # 每条倒排的差值：从它的偏移读 4 字节再按宽度掩掉多读的部分；块首没有差值（读到的是块头），记 0
        delta_at = np.repeat(offsets + _HEADER - (starts + 1) * width, counts) + index * np.repeat(width, counts)
        deltas = (words[delta_at] & np.repeat(_WIDTH_MASKS[width], counts)).astype(np.int64)
    deltas[starts] = 0
    running = np.cumsum(deltas)
    docs = running + np.repeat(words[offsets + 1].astype(np.int64) - running[starts], counts)

    # 各节词频的起点按块算好（减去本块第一条的全局序号，加上序号就是字节位置）；缺的节取定值（标题 0、正文 1）
    title_at = offsets + header + delta_sizes - starts
    terms = np.repeat(np.asarray(terms, dtype=np.int32), counts)
    if has_title.all() and has_body.all() and has_norm.all():  # 三节都在（旧块、词频各异的常见词）：一次铺开
        tf_at = np.repeat(title_at, counts) + index
        post_count = np.repeat(counts, counts)
        return Postings(terms, docs, buf[tf_at], buf[tf_at + post_count], buf[tf_at + 2 * post_count])
    body_at = title_at + has_title * counts
    title = _section(buf, title_at, has_title, counts, starts, 0)
    body = _section(buf, body_at, has_body, counts, starts, 1)
    if not has_norm.any():  # 新写的块都不带长度字节
        assert norms is not None
        return Postings(terms, docs, title, body, norms(docs))
    norm = _section(buf, body_at + has_body * counts, has_norm, counts, starts, 0)
    if not has_norm.all():
        assert norms is not None
        looked_up = np.repeat(~has_norm, counts)
        norm[looked_up] = norms(docs[looked_up])
    return Postings(terms, docs, title, body, norm)


def _bit_deltas(buf: np.ndarray, offsets: np.ndarray, counts: np.ndarray, starts: np.ndarray, index: np.ndarray,
                unit: np.ndarray, header: np.ndarray | int) -> np.ndarray:
    """有按位打包的块时，全部块的差值一起按位读（:func:`_pack_deltas` 的逆）：块 i 的差值每个 ``unit[i]`` 位
    （按字节存的块是 8·宽度），第 j 个差值从差值区的第 (j-1)·unit 位起。从它所在的字节起读 8 个字节、右移字节内的
    位偏移、掩掉多读的（32 位的差值加 7 位偏移装得进 64 位）。块首那条读到的不是差值，由调用方记 0。"""
    words = np.ndarray((buf.size - 7,), dtype="<u8", buffer=buf, strides=(1,))
    # 块首那条的位置按第 -1 个差值算：块头至少 5 字节（40 位）、差值至多 32 位，落在块头里、不会是负数（读到的值不用）
    at = np.repeat((offsets + header) * 8 - (starts + 1) * unit, counts) + index * np.repeat(unit, counts)
    masks = np.repeat((np.uint64(1) << unit.astype(np.uint64)) - np.uint64(1), counts)
    return ((words[at >> 3] >> (at & 7).astype(np.uint64)) & masks).astype(np.int64)


def _section(buf: np.ndarray, at: np.ndarray, present: np.ndarray, counts: np.ndarray, starts: np.ndarray,
             missing: int) -> np.ndarray:
    """一节（词频或长度字节）铺回每条倒排：块 i 的第 j 条在 ``buf[at[i] + starts[i] + j]``；没有这一节的块取
    ``missing``。新写的块多半几节都省掉，只对有这一节的块取。"""
    total = int(counts.sum())
    result = np.full(total, missing, dtype=np.uint8)
    chosen = np.flatnonzero(present)
    if len(chosen):
        sizes = counts[chosen]
        index = np.repeat(starts[chosen] - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()))
        result[index] = buf[np.repeat(at[chosen], sizes) + index]
    return result


def stable_order(keys: np.ndarray, key_bits: int) -> np.ndarray:
    """非负 int64 键（都小于 ``2**key_bits``）的稳定排序下标：同键保持原来的先后。

    键与下标拼得进 63 位时把下标拼在低位直接 ``np.sort``（比稳定的 argsort 快近一倍，打分与截断读取每个查询都要
    排两万条），拼不下时用稳定的 argsort。
    """
    index_bits = max(1, (len(keys) - 1).bit_length())
    if max(1, key_bits) + index_bits > 63:
        return np.argsort(keys, kind="stable")
    return np.sort((keys << index_bits) | np.arange(len(keys))) & ((1 << index_bits) - 1)


def bm25_scores(postings: Postings, slots: Mapping[int, int] | None, weights: Sequence[float], *,
                k1: float, b: float, avgdl: float, title_weight: float) -> tuple[np.ndarray, np.ndarray]:
    """BM25 打分内核：返回 (升序且不重复的 doc, 分数)，只含至少有一条倒排落在某个查询词位上的 doc。

    ``slots`` 把词 id 映射到查询词位：前缀查询词覆盖很多词位，它们共用一个位，同一 doc 在这个位上的
    加权词频先相加再饱和（与 ``raglib.bm25.chunk_score`` 一致）。``slots`` 为 None 时倒排的词 id 就是词位
    （检索一路读倒排时就按词位标号），省掉逐条查映射。``weights[slot]`` 已含 idf·qtf·(k1+1)。
    长度用解码后的 ``NORM_LENGTHS[norm]``，同一 doc 的各条倒排相同。doc 可以是负数（还没压实的分块）。
    """
    empty = np.empty(0, np.int64), np.empty(0, np.float64)
    if (slots is not None and not slots) or len(postings) == 0:
        return empty
    if slots is None:
        if int(postings.terms.min()) < 0 or int(postings.terms.max()) >= len(weights):
            raise ValueError("词位必须在 [0, len(weights)) 内")
        slot, docs, hit = postings.terms.astype(np.int64), postings.docs, None
    else:
        slot_terms = np.fromiter(slots.keys(), dtype=np.int64, count=len(slots))
        slot_values = np.fromiter(slots.values(), dtype=np.int64, count=len(slots))
        if slot_values.min() < 0 or slot_values.max() >= len(weights):
            raise ValueError("词位必须在 [0, len(weights)) 内")
        by_term = np.argsort(slot_terms)
        slot_terms, slot_values = slot_terms[by_term], slot_values[by_term]
        found = np.minimum(np.searchsorted(slot_terms, postings.terms), slot_terms.size - 1)
        hit = np.flatnonzero(slot_terms[found] == postings.terms)
        if hit.size == 0:
            return empty
        slot = slot_values[found[hit]]
        docs = postings.docs[hit]

    # 按 (doc, 词位) 排一次序，之后全是分段求和。两者拼成一个非负 int64 键（doc 可为负，先减去最小值），
    # 比 lexsort 或两次 np.unique 快一倍；范围大到拼不下时才退回 lexsort
    low, n_slots = int(docs.min()), int(slot.max()) + 1
    span = (int(docs.max()) - low + 1) * n_slots
    if span < 2**63:
        order = stable_order((docs - low) * n_slots + slot, (span - 1).bit_length())
    else:
        order = np.lexsort((slot, docs))
    docs, slot = docs[order], slot[order]
    hit = order if hit is None else hit[order]
    pair_starts = np.flatnonzero(np.r_[True, (docs[1:] != docs[:-1]) | (slot[1:] != slot[:-1])])
    tfw = title_weight * postings.title_tf[hit].astype(np.float64) + postings.body_tf[hit]
    if len(pair_starts) == len(docs):
        # 每个 (doc, 词位) 只有一条倒排（没有前缀词时总是这样）：分段求和就是原样，也不必按段首取
        tf, first, pair_slots, pair_docs = tfw, hit, slot, docs
    else:
        tf, first = np.add.reduceat(tfw, pair_starts), hit[pair_starts]
        pair_slots, pair_docs = slot[pair_starts], docs[pair_starts]
    length = NORM_LENGTHS[postings.norms[first]]
    denominator = tf + k1 * (1 - b) + k1 * b * length / max(avgdl, 1e-9)
    # 分母为 0 只可能是 tf=0（且 b=1、长度 0）：这一项贡献 0，避免 0/0
    part = np.asarray(weights, dtype=np.float64)[pair_slots] * tf / np.where(denominator > 0, denominator, 1.0)
    doc_starts = first_of_runs(pair_docs)
    return pair_docs[doc_starts], np.add.reduceat(part, doc_starts)


def top_docs(docs: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """分数降序、同分按 doc 升序的前 k 个（k 可以超过总数）。

    先用 partition 找出第 k 高的分数，再把不低于它的全部候选（含边界上的同分者）精确排序后取前 k：
    直接取 argpartition 的前 k 个会在边界同分时随意丢掉 doc 更小的那个，结果就不确定了。
    """
    docs, scores = np.asarray(docs, dtype=np.int64), np.asarray(scores, dtype=np.float64)
    if k <= 0 or docs.size == 0:
        return docs[:0], scores[:0]
    candidates = np.arange(docs.size)
    if k < docs.size:
        threshold = np.partition(scores, docs.size - k)[docs.size - k]
        candidates = np.flatnonzero(scores >= threshold)
    best = candidates[np.lexsort((docs[candidates], -scores[candidates]))[:k]]
    return docs[best], scores[best]
