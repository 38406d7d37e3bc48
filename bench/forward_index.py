"""拿掉 tsvector 列之前先量：分块的正排（词位 + 标题 / 正文词频，不要位置）换几种存法各占多少字节、解码多快，
以及短语检查改成对候选重新切词要花多少（issue #22 ①，``bench/pages/fulltext_engine.md`` 的“下一步：拿掉 tsvector 列”）。

    .venv/bin/python bench/forward_index.py --kb bench-fulltext-engine --sample 20000
    .venv/bin/python bench/forward_index.py --kb <evaluate --keep 留下的库>
    .venv/bin/python bench/forward_index.py --kb bench-fulltext-engine --insert-rows 5000   # 另量插入一侧

默认只读数据库，不改任何东西（``--insert-rows`` 见下）。对库里的分块（或按 id 取的前 ``--sample`` 个）：

- **tsvector 列**：现在存的（规范文本，pglz 压缩后）``pg_column_size``，以及文本本身的字节数；
- **文本正排**：每个词位一行 ``词位\\t标题词频\\t正文词频``，zlib 压缩（合并时可以原样搬进段，不依赖词典）；
- **列式文本正排**：词位按字节序以换行相接（UTF-8 或 GB18030：常用汉字 2 字节而不是 3），后接正文词频、标题词频各一节
  （一字节一个，截到 255），整个 zlib -9。也不依赖词典，比一行一个词位少存分隔与数字的十进制写法；
- **词号正排**：词位换成它在按字节序排好的词表里的下标（一个段的词典本来就按这个顺序存词位，下标就是段内词号，
  不用另建词表），升序差分、LEB128 变长整数，正文词频一字节一个，标题词频只记非零的（个数，再逐个“第几个词、词频”）；
  列出未压缩与 zlib 压缩两种。词表按被量的这批分块建：只量一部分（``--sample``）时词表比真实的段小、差分也小，
  词号正排因此偏小；要与段比就量全部。
- 解码一个分块的正排（补分数时每个候选要解一次）与重新切词（短语检查改在 Python 里做时每个候选要切一次）的耗时。
- 这个库在引擎各表里存活的行（不含空页与索引）每块多少字节；加上词号正排，就是拿掉 tsvector 之后 ① 的口径
  （只量一部分时不算）。

``--insert-rows N``：插入一侧的代价。把库里前 N 个分块每 500 个一条 INSERT ... SELECT 复制一遍（只在服务端，不进向量图：
``ann_pending``），:data:`INSERT_WAYS` 的几种做法交替三轮，都在最后回滚的事务里（函数、触发器、索引的改动随之撤销；
``ALTER TABLE`` 拿排它锁，量时别让服务用这个数据库；回滚留下的死行等 autovacuum）：现在的语句级触发器、把
``search_vector`` 当过渡列的行级触发器（写 L0 再置 NULL），以及把触发器逐步拆开的几种（差值就是各部分的代价）。
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


def column_forward(terms: Terms, encoding: str) -> bytes:
    """列式文本正排：词位（``encoding`` 编码，换行相接）、\\0、正文词频一节、标题词频一节，zlib -9。"""
    names = "\n".join(lexeme for lexeme, _, _ in terms).encode(encoding)
    bodies = bytes(min(body, 255) for _, _, body in terms)
    titles = bytes(min(title, 255) for _, title, _ in terms)
    return zlib.compress(names + b"\0" + bodies + titles, 9)


def decode_column_forward(data: bytes, encoding: str) -> dict[str, tuple[int, int]]:
    raw = zlib.decompress(data)
    cut = raw.index(b"\0")  # UTF-8 与 GB18030 里只有 U+0000 编出零字节，词位里没有它
    names = raw[:cut].decode(encoding).split("\n") if cut else []
    bodies = raw[cut + 1:cut + 1 + len(names)]
    titles = raw[cut + 1 + len(names):]
    return {lexeme: (titles[i], bodies[i]) for i, lexeme in enumerate(names)}


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


def _per_call_us(function: Callable[[Any], object], items: Sequence[Any]) -> float:
    started = time.perf_counter()
    for item in items:
        function(item)
    return (time.perf_counter() - started) / max(len(items), 1) * 1e6


# 全文引擎里带 knowledge_base_id 的表（统计行只有一行，不计；段表每个分块一个长度字节，v7 起要计）
_ENGINE_TABLES = ("fulltext_l0", "fulltext_docs", "fulltext_deleted", "fulltext_deleted_terms", "fulltext_dictionary",
                  "fulltext_blocks", "fulltext_prefixes", "fulltext_segments")


def engine_live_bytes(kb: str) -> int:
    """这个知识库在全文引擎各表里存活的行一共多少字节（各行数据之和，不含页里的空闲空间与索引）。"""
    total = 0
    with connection.cursor() as cursor:
        for table in _ENGINE_TABLES:
            cursor.execute(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t"  # noqa: S608 表名是常量
                           " JOIN knowledge_bases k ON k.id = t.knowledge_base_id WHERE k.name = %s", [kb])
            total += int(cursor.fetchone()[0])
    return total


def measure(kb: str, sample: int | None) -> dict[str, float]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.search_vector, pg_column_size(c.search_vector), c.chunk_text FROM document_chunks c"
            " JOIN knowledge_bases k ON k.id = c.knowledge_base_id WHERE k.name = %s AND c.search_vector IS NOT NULL"
            " ORDER BY c.id LIMIT %s", [kb, sample])
        rows = cursor.fetchall()
    if not rows:
        raise SystemExit(f"知识库 {kb!r} 没有带 tsvector 的分块")
    count = len(rows)
    parsed = [parse_vector(vector) for vector, _, _ in rows]
    vocabulary = {lexeme: i for i, lexeme in enumerate(sorted({t[0] for terms in parsed for t in terms},
                                                             key=lambda s: s.encode()))}
    texts = [text_forward(terms) for terms in parsed]
    columns = {encoding: [column_forward(terms, encoding) for terms in parsed] for encoding in ("utf-8", "gb18030")}
    raw = [id_forward([vocabulary[t[0]] for t in terms], [t[1] for t in terms], [t[2] for t in terms])
           for terms in parsed]
    packed = [zlib.compress(data, _ZLIB_LEVEL) for data in raw]
    # 解码核对：两种正排都还原出同样的 (词位, 标题, 正文)
    lexemes = sorted(vocabulary, key=vocabulary.__getitem__)
    for terms, text, data in zip(parsed[:200], texts, raw, strict=False):
        assert decode_text_forward(text) == {t[0]: (t[1], t[2]) for t in terms}
        for encoding in columns:
            assert decode_column_forward(column_forward(terms, encoding), encoding) == \
                {t[0]: (min(t[1], 255), min(t[2], 255)) for t in terms}
        ids, titles, bodies = decode_id_forward(data)
        assert [(lexemes[i], t, b) for i, t, b in zip(ids, titles, bodies, strict=True)] == \
            [(lexeme, title, min(body, 255)) for lexeme, title, body in terms]
    timing = rows[:2000]
    engine = engine_live_bytes(kb) / count if sample is None else float("nan")
    document_terms(timing[0][2], analyzer=settings.FULLTEXT_ANALYZER)  # 词典、繁简转换表在第一次调用时加载，不计时
    # 逐个分块计时（英文词干有进程内缓存：这是第一遍，多数词第一次见，偏慢）
    reanalyze = [_per_call_us(lambda text: document_terms(text, analyzer=settings.FULLTEXT_ANALYZER), [row[2]])
                 for row in timing]
    return {
        "chunks": count,
        "terms_per_chunk": sum(len(terms) for terms in parsed) / count,
        "vocabulary": len(vocabulary),
        "tsvector_stored": sum(size for _, size, _ in rows) / count,
        "tsvector_text": sum(len(vector.encode()) for vector, _, _ in rows) / count,
        "text_forward_zlib": sum(map(len, texts)) / count,
        "column_utf8_zlib": sum(map(len, columns["utf-8"])) / count,
        "column_gb18030_zlib": sum(map(len, columns["gb18030"])) / count,
        "decode_column_us": _per_call_us(lambda data: decode_column_forward(data, "gb18030"),
                                         columns["gb18030"][:2000]),
        "id_forward_raw": sum(map(len, raw)) / count,
        "id_forward_zlib": sum(map(len, packed)) / count,
        "engine_live": engine,
        "decode_text_us": _per_call_us(decode_text_forward, texts[:2000]),
        "decode_id_raw_us": _per_call_us(decode_id_forward, raw[:2000]),
        "decode_id_zlib_us": _per_call_us(lambda data: decode_id_forward(zlib.decompress(data)), packed[:2000]),
        "reanalyze_us": statistics.fmean(reanalyze),
        "reanalyze_p95_us": statistics.quantiles(reanalyze, n=20)[-1],
    }


# 插入一侧的几种做法：每种是一段在最后回滚的事务里执行的 DDL（pg_temp 里的函数随会话消失）。除了 statement，
# 都先关掉现在的语句级触发器，再各自用一个 BEFORE INSERT 的行级触发器做到某一步，逐步加上去就是触发器各部分的代价
_DISABLE_STATEMENT_TRIGGER = "ALTER TABLE document_chunks DISABLE TRIGGER document_chunks_fulltext_stats_insert;"


def _row_trigger(body: str) -> str:
    return (_DISABLE_STATEMENT_TRIGGER + """
CREATE FUNCTION pg_temp.forward_index_bench() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE v tsvector; t record;
BEGIN
    """ + body + """
    NEW.search_vector := NULL;
    RETURN NEW;
END $$;
CREATE TRIGGER forward_index_bench BEFORE INSERT ON document_chunks
    FOR EACH ROW EXECUTE FUNCTION pg_temp.forward_index_bench();
""")


_WRITE_L0 = """
    INSERT INTO fulltext_l0 (knowledge_base_id, chunk_id, document_id, length, lexemes, title_tf, body_tf)
    SELECT NEW.knowledge_base_id, NEW.id, NEW.document_id, NEW.search_length, u.lexemes, u.title_tf, u.body_tf
    FROM fulltext_chunk_terms(NEW.search_vector::tsvector) u;"""
INSERT_WAYS: dict[str, str] = {
    # 现在的做法：语句级触发器从过渡表一次写 L0（含 GIN），列照存
    "statement": "",
    # 过渡列：行级触发器写 L0 的一行（含 GIN），再把列置 NULL
    "row": _row_trigger(_WRITE_L0),
    # 逐步拆开：不要全文触发器 / 只转成 tsvector / 再取词位与词频 / 再写 L0 但没有 L0 的 GIN
    "none": _DISABLE_STATEMENT_TRIGGER,
    "cast": _row_trigger("v := NEW.search_vector::tsvector;"),
    "terms": _row_trigger("SELECT * INTO t FROM fulltext_chunk_terms(NEW.search_vector::tsvector);"),
    "row_no_gin": _row_trigger(_WRITE_L0) + "DROP INDEX fulltext_l0_lexemes;",
}
# 把行复制一遍：不进向量图（ann_pending），chunk_index 挪开以免与原来的撞上唯一约束
_COPY_ROWS = (
    "INSERT INTO document_chunks (knowledge_base_id, document_id, chunk_index, chunk_text, metadata, embedding,"
    " embedding_dim, role, token_count, text_hash, search_vector, search_length, created_at, shared_ann, ann_pending)"
    " SELECT c.knowledge_base_id, c.document_id, c.chunk_index + 100000000, c.chunk_text, c.metadata, c.embedding,"
    " c.embedding_dim, c.role, c.token_count, c.text_hash, c.search_vector, c.search_length, c.created_at, false, true"
    " FROM document_chunks c JOIN knowledge_bases k ON k.id = c.knowledge_base_id WHERE k.name = %s"
    " ORDER BY c.id OFFSET %s LIMIT %s")
_BATCH = 500


def insert_costs(kb: str, rows: int, *, rounds: int = 3, reindex_l0: bool = False) -> dict[str, list[float]]:
    """各种插入做法（:data:`INSERT_WAYS`）每个分块的毫秒数，每种 ``rounds`` 个数，交替量；之前不计时地先跑一轮，
    把要复制的行读进缓存。``reindex_l0``：先在同一个事务里重建 L0 的 GIN（批量写入之后它会膨胀，服务的维护任务
    ``search.segments.shrink_indexes`` 会把它重建回去），量的是缩回之后的样子。"""
    costs: dict[str, list[float]] = {way: [] for way in INSERT_WAYS}
    for round_number in range(rounds + 1):
        for way, setup in INSERT_WAYS.items():
            with connection.cursor() as cursor:
                cursor.execute("BEGIN")
                try:
                    if reindex_l0:
                        cursor.execute("REINDEX INDEX fulltext_l0_lexemes")
                    if setup:
                        cursor.execute(setup)
                    started = time.perf_counter()
                    for offset in range(0, rows, _BATCH):
                        cursor.execute(_COPY_ROWS, [kb, offset, min(_BATCH, rows - offset)])
                    if round_number:
                        costs[way].append((time.perf_counter() - started) / rows * 1000)
                finally:
                    cursor.execute("ROLLBACK")
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kb", action="append", required=True, help="知识库名（可重复）")
    parser.add_argument("--sample", type=int, default=None, help="只量按分块 id 排序的前这么多个（默认全部）")
    parser.add_argument("--insert-rows", type=int, default=0,
                        help="另量插入一侧：每种做法各复制这么多个分块（回滚），每个分块的毫秒数")
    parser.add_argument("--reindex-l0", action="store_true", help="量插入之前在同一个事务里重建 L0 的 GIN")
    args = parser.parse_args()
    if args.insert_rows:
        for kb in args.kb:
            costs = insert_costs(kb, args.insert_rows, reindex_l0=args.reindex_l0)
            print(f"{kb}：插入每块 ms（三轮）" + "；".join(
                f"{way} {' / '.join(f'{v:.3f}' for v in values)}" for way, values in costs.items()), flush=True)
        return
    print("| 知识库 | 分块 | 每块词位 | tsvector 存的 / 文本 B | 文本正排 zlib B | 列式文本正排 UTF-8 / GB18030 B | "
          "词号正排 未压缩 / zlib B | 解码 µs（文本 / 列式 GB18030 / 词号 / 词号 zlib） | 重新切词 µs 均值 / p95 | "
          "引擎存活的行 B | 引擎 + 列式 GB18030 / + 词号正排 zlib B |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kb in args.kb:
        m = measure(kb, args.sample)
        print(f"| {kb} | {m['chunks']:,.0f} | {m['terms_per_chunk']:.0f} | {m['tsvector_stored']:,.0f} / "
              f"{m['tsvector_text']:,.0f} | {m['text_forward_zlib']:,.0f} | {m['column_utf8_zlib']:,.0f} / "
              f"{m['column_gb18030_zlib']:,.0f} | {m['id_forward_raw']:,.0f} / {m['id_forward_zlib']:,.0f} | "
              f"{m['decode_text_us']:.0f} / {m['decode_column_us']:.0f} / {m['decode_id_raw_us']:.0f} / "
              f"{m['decode_id_zlib_us']:.0f} | {m['reanalyze_us']:.0f} / {m['reanalyze_p95_us']:.0f} | "
              f"{m['engine_live']:,.0f} | {m['engine_live'] + m['column_gb18030_zlib']:,.0f} / "
              f"{m['engine_live'] + m['id_forward_zlib']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
