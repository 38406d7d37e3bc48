"""分块的正排：一个分块的词位与各自的标题 / 正文词频，压缩成一个字节串（纯 Python，不碰数据库）。

全文引擎不再在 ``document_chunks`` 里存 tsvector（10 万块的库每块 2.1 KB，是全文数据里最大的一项），合并时把每个
分块的词项写成这里的正排，存进序号表 ``fulltext_docs.terms``；分块被删时触发器把它原样搬进删除集，df 据此减掉。
补分数（名单外的候选）、删除集的折叠与清除、核对都从它解码。它不带位置：短语检查对候选的原文重新切词
（``search.bm25``），Lucene 的索引也不存位置（508 B/块）。

格式（落盘格式：能读的旧串永远要能读，改写法只能换一个开头）::

    zlib( 4 字节 词位数 n，uint32 小端
          各词位的 GB18030 编码，以 0 字节隔开（n 个词位 n-1 个 0）
          1 字节 0
          n 字节 正文词频（截到 TF_MAX）
          n 字节 标题词频（截到 TF_MAX） )

为什么这样存（``bench/forward_index.py`` 在 10 万块的合成库与两个开发集上量过，见 ``bench/pages/fulltext_engine.md``
的“量过的存法”；脚本在正排落地后删掉，在 git 历史里）：
- 词位不换成段内词号：词号跟着段走，并段要重编、删除集要记出自哪个段；存词位本身，正排写一次就不再动；
- 词位按列放在一起、词频另成两节，zlib 找得到重复（bigram 的首字、成串的 1 与 0）；一行一个
  ``词位\\t标题\\t正文`` 的写法大约多 15%；
- GB18030 里常用汉字 2 字节（UTF-8 是 3），整段小约一成；只有 U+0000 编出 0 字节，而 PostgreSQL 的文本里没有它，
  所以 0 字节可以当分隔；
- PostgreSQL 自带的 pglz 压不动它（前 1 KB 找不到重复就放弃，压不到 25% 也放弃），所以在 Python 里用 zlib 压好再存。
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from raglib.postings import TF_MAX, capped_tf

_ENCODING = "gb18030"
_LEVEL = 9
_COUNT = struct.Struct("<I")


@dataclass(frozen=True)
class ForwardTerms:
    """解码后的正排：词位（写入时的顺序）与同序的标题、正文词频（已截到一个字节）。"""

    lexemes: list[str]
    title_tf: bytes
    body_tf: bytes

    def counts(self) -> dict[str, tuple[int, int]]:
        """词位 → (标题词频, 正文词频)。"""
        return {lexeme: (self.title_tf[i], self.body_tf[i]) for i, lexeme in enumerate(self.lexemes)}

    def select(self, lexemes: Iterable[str], prefixes: Iterable[str] = ()) -> dict[str, tuple[int, int]]:
        """查询词那几项的 (标题词频, 正文词频)：``lexemes`` 按整词找，``prefixes`` 取以它开头的全部词位；
        分块里没有的不出现在结果里。"""
        wanted, heads = set(lexemes), tuple(prefixes)
        return {lexeme: (self.title_tf[i], self.body_tf[i]) for i, lexeme in enumerate(self.lexemes)
                if lexeme in wanted or (heads and lexeme.startswith(heads))}

    @classmethod
    def from_columns(cls, lexemes: Sequence[str], title_tf: Sequence[int], body_tf: Sequence[int]) -> ForwardTerms:
        """L0 的三列（词频是 smallint，未截断）→ 与解码结果同形的正排。"""
        return cls(list(lexemes), bytes(capped_tf(tf) for tf in title_tf), bytes(capped_tf(tf) for tf in body_tf))


def encode(lexemes: Sequence[str], title_tf: Sequence[int], body_tf: Sequence[int]) -> bytes:
    """一个分块的正排。三个序列等长；词位里不能有 U+0000（PostgreSQL 的文本本来就不允许）。"""
    if not len(lexemes) == len(title_tf) == len(body_tf):
        raise ValueError("lexemes, title_tf and body_tf differ in length")
    names = "\0".join(lexemes)
    if names.count("\0") != max(len(lexemes) - 1, 0):
        raise ValueError("a lexeme contains U+0000")
    raw = b"".join([_COUNT.pack(len(lexemes)), names.encode(_ENCODING), b"\0", _tf_bytes(body_tf),
                    _tf_bytes(title_tf)])
    # 窗口取装得下整段的最小值：默认的 32 KB 窗口光是初始化就占了一个分块压缩时间的大半（1.5 KB 的正排 61 → 24 µs），
    # 压出来的字节相同；解压时 zlib 按数据头里记的窗口来，调用方不用知道
    compressor = zlib.compressobj(_LEVEL, zlib.DEFLATED, max(9, min(15, (len(raw) - 1).bit_length())))
    return compressor.compress(raw) + compressor.flush()


def _tf_bytes(tfs: Sequence[int]) -> bytes:
    """词频一个一字节，截到 ``TF_MAX``；常见情形（都在 0~255 里）直接转，不逐个截。"""
    if not tfs or (min(tfs) >= 0 and max(tfs) <= TF_MAX):
        return bytes(tfs)
    return bytes(capped_tf(tf) for tf in tfs)


def decode(data: bytes) -> ForwardTerms:
    """:func:`encode` 的逆；数据不完整或长度对不上时抛 ``ValueError``（“正排损坏”）。"""
    try:
        raw = zlib.decompress(data)
    except zlib.error as error:
        raise ValueError(f"正排损坏：{error}") from error
    if len(raw) < _COUNT.size + 1:
        raise ValueError("正排损坏：太短")
    (count,) = _COUNT.unpack_from(raw)
    names_end = len(raw) - 2 * count - 1
    if names_end < _COUNT.size or raw[names_end] != 0:
        raise ValueError("正排损坏：词频的长度与词位数不符")
    lexemes = raw[_COUNT.size:names_end].decode(_ENCODING).split("\0") if count else []
    if len(lexemes) != count:
        raise ValueError("正排损坏：词位数不符")
    return ForwardTerms(lexemes, raw[names_end + 1 + count:], raw[names_end + 1:names_end + 1 + count])
