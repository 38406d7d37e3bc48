"""拿掉 tsvector 列之前先量：分块的正排（词位 + 标题 / 正文词频，不要位置）换几种存法各占多少字节、解码多快，
以及短语检查改成对候选重新切词要花多少（issue #22 ①，``bench/pages/fulltext_engine.md`` 的“下一步：拿掉 tsvector 列”）。

    .venv/bin/python bench/forward_index.py --kb bench-fulltext-engine --sample 20000
    .venv/bin/python bench/forward_index.py --kb <evaluate --keep 留下的库>

只读数据库，不改任何东西。对库里的分块（或按 id 取的前 ``--sample`` 个）：

- **tsvector 列**：现在存的（规范文本，pglz 压缩后）``pg_column_size``，以及文本本身的字节数；
- **文本正排**：每个词位一行 ``词位\\t标题词频\\t正文词频``，zlib 压缩（合并时可以原样搬进段，不依赖词典）；
- **词号正排**：词位换成它在按字节序排好的词表里的下标（一个段的词典本来就按这个顺序存词位，下标就是段内词号，
  不用另建词表），升序差分、LEB128 变长整数，正文词频一字节一个，标题词频只记非零的（个数，再逐个“第几个词、词频”）；
  列出未压缩与 zlib 压缩两种。词表按被量的这批分块建：只量一部分（``--sample``）时词表比真实的段小、差分也小，
  词号正排因此偏小；要与段比就量全部。
- 解码一个分块的正排（补分数时每个候选要解一次）与重新切词（短语检查改在 Python 里做时每个候选要切一次）的耗时。
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__":  # 直接运行时自己配置 Django；测试导入时 Django 已经配好
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from django_setup import setup_django

    setup_django()

from django.conf import settings
from django.db import connection

from raglib.analysis import document_terms

# tsvector 规范文本里的一个条目：'词位'（内部单引号加倍、反斜杠加倍）:位置串（如 1A,5B；B 是正文，A 是标题）
_ENTRY = re.compile(r"'((?:[^']|'')*)':([0-9A-D,]+)")
_ZLIB_LEVEL = 6

Terms = list[tuple[str, int, int]]  # (词位, 标题词频, 正文词频)，按词位的字节序


def parse_vector(vector: str) -> Terms:
    """规范文本 → (词位, 标题词频, 正文词频)。没有权重字母的位置是 D（本项目不写），按正文计。"""
    terms = []
    for match in _ENTRY.finditer(vector):
        lexeme = match.group(1).replace("''", "'").replace("\\\\", "\\")
        positions = match.group(2).split(",")
        title = sum(p.endswith("A") for p in positions)
        terms.append((lexeme, title, len(positions) - title))
    return terms


def text_forward(terms: Terms) -> bytes:
    return zlib.compress("\n".join(f"{lexeme}\t{title}\t{body}" for lexeme, title, body in terms).encode(),
                         _ZLIB_LEVEL)


def decode_text_forward(data: bytes) -> dict[str, tuple[int, int]]:
    out = {}
    for line in zlib.decompress(data).decode().split("\n"):
        lexeme, title, body = line.split("\t")
        out[lexeme] = (int(title), int(body))
    return out


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def id_forward(ids: Sequence[int], titles: Sequence[int], bodies: Sequence[int]) -> bytes:
    """词号正排（未压缩）：个数、升序词号的差分、正文词频（一字节，截到 255），标题词频非零的个数与（下标，词频）。"""
    out = bytearray()
    _varint(len(ids), out)
    previous = 0
    for term_id in ids:
        _varint(term_id - previous, out)
        previous = term_id
    out += bytes(min(body, 255) for body in bodies)
    nonzero = [(i, min(t, 255)) for i, t in enumerate(titles) if t]
    _varint(len(nonzero), out)
    for index, tf in nonzero:
        _varint(index, out)
        out.append(tf)
    return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def decode_id_forward(data: bytes) -> tuple[list[int], list[int], list[int]]:
    count, at = _read_varint(data, 0)
    ids = []
    previous = 0
    for _ in range(count):
        delta, at = _read_varint(data, at)
        previous += delta
        ids.append(previous)
    bodies = list(data[at:at + count])
    at += count
    titles = [0] * count
    nonzero, at = _read_varint(data, at)
    for _ in range(nonzero):
        index, at = _read_varint(data, at)
        titles[index] = data[at]
        at += 1
    return ids, titles, bodies


def _per_call_us(function, items: Sequence[object]) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    for item in items:
        function(item)
    return (time.perf_counter() - started) / max(len(items), 1) * 1e6


def measure(kb: str, sample: int | None) -> dict[str, float]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.search_vector, pg_column_size(c.search_vector), c.chunk_text FROM document_chunks c"
            " JOIN knowledge_bases k ON k.id = c.knowledge_base_id WHERE k.name = %s AND c.search_vector IS NOT NULL"
            " ORDER BY c.id LIMIT %s", [kb, sample])
        rows = cursor.fetchall()
    if not rows:
        raise SystemExit(f"知识库 {kb!r} 没有带 tsvector 的分块")
    parsed = [parse_vector(vector) for vector, _, _ in rows]
    vocabulary = {lexeme: i for i, lexeme in enumerate(sorted({t[0] for terms in parsed for t in terms},
                                                             key=lambda s: s.encode()))}
    texts = [text_forward(terms) for terms in parsed]
    raw = [id_forward([vocabulary[t[0]] for t in terms], [t[1] for t in terms], [t[2] for t in terms])
           for terms in parsed]
    packed = [zlib.compress(data, _ZLIB_LEVEL) for data in raw]
    # 解码核对：两种正排都还原出同样的 (词位, 标题, 正文)
    lexemes = sorted(vocabulary, key=vocabulary.__getitem__)
    for terms, text, data in zip(parsed[:200], texts, raw, strict=False):
        assert decode_text_forward(text) == {t[0]: (t[1], t[2]) for t in terms}
        ids, titles, bodies = decode_id_forward(data)
        assert [(lexemes[i], t, b) for i, t, b in zip(ids, titles, bodies, strict=True)] == \
            [(lexeme, title, min(body, 255)) for lexeme, title, body in terms]
    timing = rows[:2000]
    document_terms(timing[0][2], analyzer=settings.FULLTEXT_ANALYZER)  # 词典、繁简转换表在第一次调用时加载，不计时
    # 逐个分块计时（英文词干有进程内缓存：这是第一遍，多数词第一次见，偏慢）
    reanalyze = [_per_call_us(lambda text: document_terms(text, analyzer=settings.FULLTEXT_ANALYZER), [row[2]])
                 for row in timing]
    count = len(rows)
    return {
        "chunks": count,
        "terms_per_chunk": sum(len(terms) for terms in parsed) / count,
        "vocabulary": len(vocabulary),
        "tsvector_stored": sum(size for _, size, _ in rows) / count,
        "tsvector_text": sum(len(vector.encode()) for vector, _, _ in rows) / count,
        "text_forward_zlib": sum(map(len, texts)) / count,
        "id_forward_raw": sum(map(len, raw)) / count,
        "id_forward_zlib": sum(map(len, packed)) / count,
        "decode_text_us": _per_call_us(decode_text_forward, texts[:2000]),
        "decode_id_raw_us": _per_call_us(decode_id_forward, raw[:2000]),
        "decode_id_zlib_us": _per_call_us(lambda data: decode_id_forward(zlib.decompress(data)), packed[:2000]),
        "reanalyze_us": statistics.fmean(reanalyze),
        "reanalyze_p95_us": statistics.quantiles(reanalyze, n=20)[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kb", action="append", required=True, help="知识库名（可重复）")
    parser.add_argument("--sample", type=int, default=None, help="只量按分块 id 排序的前这么多个（默认全部）")
    args = parser.parse_args()
    print("| 知识库 | 分块 | 每块词位 | tsvector 存的 / 文本 B | 文本正排 zlib B | 词号正排 未压缩 / zlib B | "
          "解码 µs（文本 / 词号 / 词号 zlib） | 重新切词 µs 均值 / p95 |")
    print("|---|---|---|---|---|---|---|---|")
    for kb in args.kb:
        m = measure(kb, args.sample)
        print(f"| {kb} | {m['chunks']:,.0f} | {m['terms_per_chunk']:.0f} | {m['tsvector_stored']:,.0f} / "
              f"{m['tsvector_text']:,.0f} | {m['text_forward_zlib']:,.0f} | {m['id_forward_raw']:,.0f} / "
              f"{m['id_forward_zlib']:,.0f} | {m['decode_text_us']:.0f} / {m['decode_id_raw_us']:.0f} / "
              f"{m['decode_id_zlib_us']:.0f} | {m['reanalyze_us']:.0f} / {m['reanalyze_p95_us']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
