"""全文引擎 v2 的写侧：把 L0 合并成段、合并相邻的段、整库删除、重建与核对。

存储布局（表的定义与为什么见 ``search/sql/fulltext_storage.v2.sql`` 及之后各版）：

- 写入分块时触发器只往 ``fulltext_l0`` 追加一行（``fulltext_stats_maintain.v3.sql``）；
- :func:`compact` 在一个事务里取走一个知识库 L0 的一批行，按顺序分配稠密的 int4 序号，编成一个新段
  （词典块 + 倒排块，字节格式见 :mod:`raglib.lexicon`、:mod:`raglib.postings`），再按合并策略并掉相邻的小段；
  并段按词位分片（约每 ``_SLICE_DOCS`` 个分块一片）读各段、编好一片写一片，进程内存与并出的段多大无关；
- 删除已合并的分块只在 ``fulltext_deleted`` 记一行；每次合并把新的删除按词折叠进 ``fulltext_deleted_terms``
  （查询修正 df 时一个词一次主键查找），段被合并时，落在它序号范围里的删除一并清掉、计数减回去。

合并在知识库统计行上加行锁（``FOR UPDATE``），同一知识库的合并依次进行；写入分块不碰这一行，不受合并影响。
事务中途被杀（进程被 SIGKILL、数据库重启）时整批回滚：L0 的行还在，段没写出，索引保持合并前的样子，照常可查。

合并策略（Lucene 的 LogMergePolicy 的做法）：段按分块数分层，第 k 层是 ``[B·F^k, B·F^(k+1))``；最新的
``F`` 个相邻的段落在同一层就并成一个（F = ``MERGE_FACTOR``）。段数因此约为 ``(F-1)·层数``，每个倒排一生中被
重写约 log_F(N/B) 次。删除超过段内分块十分之一的段单独重写一次，把删掉的倒排清出去：删除集越小，
查询时按它修正 df 越便宜。知识库写完、闲下来之后（:func:`idle_due`），维护任务再把最新的一串段并成一个
（:func:`merge_idle`）：批量导入留下的几个段通常并成一个，词典几乎减半，查询只查一个段。
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.conf import settings
from django.db import OperationalError, connection, transaction
from psycopg import sql as psql

from infra.locks import advisory_lock
from raglib import forward
from raglib.lexicon import SegmentRows, build_segment, decode_dictionary_block, prefix_dfs, read_segment
from raglib.postings import TF_MAX, NormLookup, Postings, capped_tf, dense_norms, norm_bytes
from search.chunk_terms import reindex_chunks

# 相邻的这么多个同层段并成一个
MERGE_FACTOR = 8
# 第 0 层的上界（分块数）：比这小的段都算同一层
_BASE_DOCS = 1000
# 闲时合并（merge_idle）：前一个段不超过已收的段合计的这么多倍、或不超过这么多个分块（并一次只要十几秒），
# 才收进来（见 _idle_run）
_IDLE_MERGE_RATIO = 4
_IDLE_MERGE_FLOOR = 20_000
# 段内被删的分块超过这个比例就单独重写
_PURGE_RATIO = 0.1  # 见模块说明的合并策略
# 并段按词位分片读、写：一片约是这么多个分块的倒排（整段读进内存时并 10 万块要 3.5 GB，分片后约 1 GB，
# bench/pages/fulltext_engine.md；并 100 万块的段峰值约 2.3 GB）
_SLICE_DOCS = 20_000
# 并出来的段最多 RAG_FULLTEXT_MAX_SEGMENT_CHUNKS 个分块（Lucene 的 maxMergedSegmentMB）。段数是大库查询的主要代价：
# 每个查询词在每个段里各查一次词典、各读一份按比例分摊的倒排块——100 万块的库 5 个 20 万块的段时 p95 11~12 ms，
# 并成 1 个段 4.5~5.4 ms，与 10 万块的库相同（bench/pages/fulltext_scale.md）。代价：一次并段是一个事务、持着
# 知识库统计行的锁（这期间这个库的 L0 合并等着，写入照常进 L0），并 100 万块约 1 分钟


@dataclass(frozen=True)
class CompactResult:
    """一次 :func:`compact` 做了什么：合并进段的 L0 分块数、新写的段数、并掉的段数、清出的已删分块数。"""

    chunks: int = 0
    segments: int = 0
    merged: int = 0
    purged: int = 0

    def __add__(self, other: CompactResult) -> CompactResult:
        return CompactResult(self.chunks + other.chunks, self.segments + other.segments,
                             self.merged + other.merged, self.purged + other.purged)


@dataclass(frozen=True)
class _Segment:
    segment_id: int
    first: int
    end: int
    docs: int


# ---------------------------------------------------------------- 合并：L0 → 段


def compact_due(*, kb_id: uuid.UUID | None = None, min_chunks: int = 1) -> dict[uuid.UUID, CompactResult]:
    """合并 L0 里至少有 ``min_chunks`` 个分块、或删除集里有还没折叠的分块的知识库（``kb_id`` 限定一个）；
    正在被别人合并的跳过。"""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT s.knowledge_base_id FROM fulltext_kb_stats s WHERE (%s::uuid IS NULL OR s.knowledge_base_id = %s)"
            " AND ((SELECT count(*) FROM (SELECT 1 FROM fulltext_l0 l WHERE l.knowledge_base_id = s.knowledge_base_id"
            " LIMIT %s) x) >= %s OR EXISTS (SELECT 1 FROM fulltext_deleted d"
            " WHERE d.knowledge_base_id = s.knowledge_base_id AND NOT d.folded))",
            [kb_id, kb_id, min_chunks, min_chunks])
        due = [row[0] for row in cursor.fetchall()]
    done = {}
    for kb in due:
        result = compact(kb, wait=False)
        if result.chunks or result.segments:
            done[kb] = result
    return done


def compact(kb_id: uuid.UUID, *, batch: int | None = None, wait: bool = True, once: bool = False) -> CompactResult:
    """把知识库 L0 里的分块全部合并成段（每 ``batch`` 个分块一个段、一个事务），再按合并策略并段、清删除。

    ``wait=False`` 时同一知识库正在合并就立即返回（定时任务与写入后入队的任务用）；``once`` 只做一批
    （``manage.py compact_fulltext`` 每批报告一次进度）。
    """
    batch = batch or settings.FULLTEXT_COMPACT_BATCH
    result = CompactResult()
    while True:
        step = _compact_once(kb_id, batch, wait)
        result += step
        if once or step.chunks < batch:
            return result


# 合并在统计行上加行锁：同一知识库的合并依次进行，写入分块不碰这一行
_LOCK_STATE_SQL = "SELECT next_ordinal, next_segment FROM fulltext_kb_stats WHERE knowledge_base_id = %s FOR UPDATE"


def _compact_once(kb_id: uuid.UUID, batch: int, wait: bool) -> CompactResult:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_LOCK_STATE_SQL if wait else _LOCK_STATE_SQL + " SKIP LOCKED", [kb_id])
        state = cursor.fetchone()
        if state is None:
            # 没有统计行的知识库没有全文数据（正在清理，或从没写过）；或者别人正在合并它
            return CompactResult()
        next_ordinal, next_segment = int(state[0]), int(state[1])
        # 取走一批 L0 行并锁住：同时删除其中某个分块的事务等到这里提交，再到 fulltext_docs 里找它（见触发器的注释）。
        # 别的事务正在删的行（已加锁）跳过，留给下一次
        cursor.execute(
            # 选中的行先物化：写成 IN (子查询) 时规划器可能对外层每一行重算子查询，LIMIT 就管不住取走的行数
            "WITH picked AS MATERIALIZED (SELECT chunk_id FROM fulltext_l0 WHERE knowledge_base_id = %s"
            " ORDER BY chunk_id LIMIT %s FOR UPDATE SKIP LOCKED)"
            " DELETE FROM fulltext_l0 l USING picked WHERE l.knowledge_base_id = %s AND l.chunk_id = picked.chunk_id"
            " RETURNING l.chunk_id, l.length, l.lexemes, l.title_tf, l.body_tf, l.document_id",
            [kb_id, batch, kb_id],
        )
        rows = sorted(cursor.fetchall())
        result = CompactResult()
        if rows:
            end = next_ordinal + len(rows)
            lexemes, postings = _l0_postings(rows, next_ordinal)
            _write_segment(cursor, kb_id, _Segment(next_segment, next_ordinal, end, len(rows)),
                           build_segment(lexemes, postings),
                           norm_bytes(np.fromiter((row[1] for row in rows), dtype=np.int64, count=len(rows))))
            # 每个分块的正排随序号表的行写一次（不带位置，raglib.forward）：删除时触发器把它搬进删除集，补分数、
            # 核对也从它读。并段不动序号表
            cursor.execute(
                "INSERT INTO fulltext_docs (knowledge_base_id, ordinal, chunk_id, length, document_id, terms)"
                " SELECT %s, o, c, l, d, t FROM unnest(%s::int[], %s::bigint[], %s::int[], %s::uuid[], %s::bytea[])"
                " AS r(o, c, l, d, t)",
                [kb_id, list(range(next_ordinal, end)), [row[0] for row in rows], [row[1] for row in rows],
                 [row[5] for row in rows], [forward.encode(row[2], row[3], row[4]) for row in rows]],
            )
            cursor.execute(
                "UPDATE fulltext_kb_stats SET chunk_count = chunk_count + %s, total_length = total_length + %s,"
                " next_ordinal = %s, next_segment = %s WHERE knowledge_base_id = %s",
                [len(rows), sum(int(row[1]) for row in rows), end, next_segment + 1, kb_id],
            )
            next_segment += 1
            result = CompactResult(chunks=len(rows), segments=1)
        _fold_deleted(cursor, kb_id)
        return result + _merge_due(cursor, kb_id, next_segment)


def _fold_deleted(cursor: Any, kb_id: uuid.UUID) -> None:
    """把删除集里还没折叠的分块的词位计进 ``fulltext_deleted_terms``：快照里看到的那些一次标记、一次写入。

    之后才提交的删除留着不折叠，查询照样逐行数它们，下一次合并再折叠。正排在 Python 里解码（SQL 里解不开 zlib）。
    """
    cursor.execute("UPDATE fulltext_deleted SET folded = true WHERE knowledge_base_id = %s AND NOT folded"
                   " RETURNING terms", [kb_id])
    counts = _lexeme_counts(bytes(data) for (data,) in cursor.fetchall())
    if counts:
        cursor.execute(
            "INSERT INTO fulltext_deleted_terms AS t (knowledge_base_id, lexeme, count)"
            " SELECT %s, x, n FROM unnest(%s::text[], %s::int[]) AS c(x, n)"
            " ON CONFLICT (knowledge_base_id, lexeme) DO UPDATE SET count = t.count + EXCLUDED.count",
            [kb_id, list(counts), list(counts.values())])


def _lexeme_counts(terms: Iterable[bytes]) -> dict[str, int]:
    """一批正排里每个词位出现在几个分块里。"""
    counts: dict[str, int] = {}
    for data in terms:
        for lexeme in forward.decode(data).lexemes:
            counts[lexeme] = counts.get(lexeme, 0) + 1
    return counts


def _l0_postings(rows: Sequence[tuple[Any, ...]], first_ordinal: int) -> tuple[list[str], Postings]:
    """L0 的行（按分块 id 排好）→ 词位表与倒排：第 i 行的分块得到序号 ``first_ordinal + i``。

    一批几千个分块就有上百万个 (分块, 词位)：各列先拍平成一个列表（C 里拼接），再一次换成下标。"""
    flat = list(itertools.chain.from_iterable(row[2] for row in rows))
    lexemes, terms = _vocabulary(flat)
    sizes = np.fromiter((len(row[2]) for row in rows), dtype=np.int64, count=len(rows))
    docs = np.repeat(np.arange(first_ordinal, first_ordinal + len(rows), dtype=np.int64), sizes)
    lengths = np.repeat(np.fromiter((row[1] for row in rows), dtype=np.int64, count=len(rows)), sizes)
    title = np.fromiter(itertools.chain.from_iterable(row[3] for row in rows), dtype=np.int64, count=len(flat))
    body = np.fromiter(itertools.chain.from_iterable(row[4] for row in rows), dtype=np.int64, count=len(flat))
    return lexemes, Postings(terms, docs, np.clip(title, 0, TF_MAX).astype(np.uint8),
                             np.clip(body, 0, TF_MAX).astype(np.uint8), norm_bytes(lengths))


def _write_segment(cursor: Any, kb_id: uuid.UUID, segment: _Segment, rows: SegmentRows, norms: np.ndarray) -> None:
    _insert_segment(cursor, kb_id, segment, norms)
    _write_terms(cursor, kb_id, segment.segment_id, rows)
    _write_prefixes(cursor, kb_id, segment.segment_id, rows.prefixes)


def _insert_segment(cursor: Any, kb_id: uuid.UUID, segment: _Segment, norms: np.ndarray) -> None:
    """段表的一行，带上 [first, end) 每个序号的长度字节（块里不再逐条存它，见 ``fulltext_storage.v7.sql``）。"""
    if len(norms) != segment.end - segment.first:
        raise ValueError("段的长度字节与它的序号范围不等长")
    cursor.execute("INSERT INTO fulltext_segments (knowledge_base_id, segment_id, first_ordinal, end_ordinal,"
                   " doc_count, norms) VALUES (%s, %s, %s, %s, %s, %s)",
                   [kb_id, segment.segment_id, segment.first, segment.end, segment.docs,
                    np.asarray(norms, dtype=np.uint8).tobytes()])


def _write_terms(cursor: Any, kb_id: uuid.UUID, segment_id: int, rows: SegmentRows) -> None:
    """一个段（或它的一片词位）的词典块与倒排块，COPY 写入：一片有上万行，拼成数组参数时每个元素都要在
    Python 里转义（text[]、bytea[] 的字面量），比 COPY 在 C 里逐行编码慢得多。"""
    with cursor.cursor.copy("COPY fulltext_dictionary (knowledge_base_id, segment_id, first_lexeme, data)"
                            " FROM STDIN") as copy:
        for first, data in rows.dictionary:
            copy.write_row((kb_id, segment_id, first, data))
    with cursor.cursor.copy("COPY fulltext_blocks (knowledge_base_id, segment_id, lexeme, block_no, data)"
                            " FROM STDIN") as copy:
        for lexeme, number, data in rows.blocks:
            copy.write_row((kb_id, segment_id, lexeme, number, data))


def _write_prefixes(cursor: Any, kb_id: uuid.UUID, segment_id: int, prefixes: Sequence[tuple[str, int]]) -> None:
    if prefixes:
        cursor.execute("INSERT INTO fulltext_prefixes (knowledge_base_id, segment_id, prefix, df)"
                       " SELECT %s, %s, p, d FROM unnest(%s::text[], %s::int[]) AS r(p, d)",
                       [kb_id, segment_id, [prefix for prefix, _ in prefixes], [df for _, df in prefixes]])


# ---------------------------------------------------------------- 并段与清除删除


def _tier(docs: int) -> int:
    return 0 if docs < _BASE_DOCS else 1 + int(math.log(docs / _BASE_DOCS, MERGE_FACTOR))


def _segments(cursor: Any, kb_id: uuid.UUID) -> list[_Segment]:
    cursor.execute("SELECT segment_id, first_ordinal, end_ordinal, doc_count FROM fulltext_segments"
                   " WHERE knowledge_base_id = %s ORDER BY first_ordinal", [kb_id])
    return [_Segment(*map(int, row)) for row in cursor.fetchall()]


def _merge_due(cursor: Any, kb_id: uuid.UUID, next_segment: int) -> CompactResult:
    """按合并策略并段：最新的 MERGE_FACTOR 个相邻段同层就并掉，直到没有可并的；再重写删除过多的段。"""
    result = CompactResult()
    while True:
        segments = _segments(cursor, kb_id)
        tail = segments[-MERGE_FACTOR:]
        if (len(tail) < MERGE_FACTOR or len({_tier(segment.docs) for segment in tail}) != 1
                or sum(segment.docs for segment in tail) > settings.FULLTEXT_MAX_SEGMENT_CHUNKS):
            break
        result += _merge(cursor, kb_id, tail, next_segment)
        next_segment += 1
    cursor.execute("SELECT s.segment_id FROM fulltext_segments s WHERE s.knowledge_base_id = %s"
                   " AND (SELECT count(*) FROM fulltext_deleted d WHERE d.knowledge_base_id = s.knowledge_base_id"
                   " AND d.ordinal >= s.first_ordinal AND d.ordinal < s.end_ordinal) > %s * s.doc_count",
                   [kb_id, _PURGE_RATIO])
    heavy = {int(row[0]) for row in cursor.fetchall()}
    for segment in (s for s in _segments(cursor, kb_id) if s.segment_id in heavy):
        result += _merge(cursor, kb_id, [segment], next_segment)
        next_segment += 1
    if result.segments:
        cursor.execute("UPDATE fulltext_kb_stats SET next_segment = %s WHERE knowledge_base_id = %s",
                       [next_segment, kb_id])
    return result


def merge_all(kb_id: uuid.UUID) -> CompactResult:
    """把知识库的段尽量并成少数几个大段（Lucene 的 forceMerge）：从最早的段起，相邻的段依次并进来，直到再并就超过
    ``RAG_FULLTEXT_MAX_SEGMENT_CHUNKS``。每个大段一个事务。

    大批写入（升级时整库转换、批量导入）之后用：每个段都有一份自己的罕见词词典，100k 个分块的 5 个段里有 474 万个
    词条、其实只有 241 万个不同的词；并成一个段词典几乎减半，查询也少查几个段。``manage.py compact_fulltext --merge``。
    """
    return _merge_runs(kb_id, _next_run)


def merge_idle(kb_id: uuid.UUID) -> CompactResult:
    """闲下来的知识库（见 :func:`idle_due`）把最新的一串段并成一个：不把一个大段为几个小段整个重写（见
    :func:`_idle_run`）。批量导入之后通常并成一个段：词典几乎减半，查询只查一个段。"""
    return _merge_runs(kb_id, _idle_run)


def settle(kb_id: uuid.UUID) -> CompactResult:
    """把一个知识库的全文索引整理成闲下来、定时维护跑过之后的样子：L0 合并成段、闲时并段（并过就把小的段表
    重写紧凑）、停在高峰的索引重建回去。服务自己会在 ``RAG_FULLTEXT_IDLE_MERGE_MINUTES`` 之内做完这些；
    ``manage.py evaluate`` 摄取完调用它，量的是稳态下的知识库。排序不变（FULLTEXT-MAINTENANCE-NEUTRAL）。"""
    result = compact(kb_id) + merge_idle(kb_id)
    if result.merged:
        repack_tables()
    shrink_indexes()
    return result


def idle_due(minutes: int) -> list[uuid.UUID]:
    """闲下来、又有不止一个段的知识库：L0 里没有它的分块，最新的段写出已超过 ``minutes`` 分钟（写入先进 L0、
    每分钟合并成段，最新的段的时间就是最近一次写入的时间）。"""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT s.knowledge_base_id FROM fulltext_segments s GROUP BY s.knowledge_base_id"
            " HAVING count(*) > 1 AND max(s.created_at) < now() - make_interval(mins => %s)"
            " AND NOT EXISTS (SELECT 1 FROM fulltext_l0 l WHERE l.knowledge_base_id = s.knowledge_base_id)"
            " ORDER BY s.knowledge_base_id", [minutes])
        return [row[0] for row in cursor.fetchall()]


def _merge_runs(kb_id: uuid.UUID, pick: Callable[[Sequence[_Segment]], list[_Segment] | None]) -> CompactResult:
    """按 ``pick`` 选出的相邻段一串串地并，直到它选不出；每串一个事务，持着知识库统计行的锁（与合并 L0 互斥）。"""
    result = CompactResult()
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_LOCK_STATE_SQL, [kb_id])
            state = cursor.fetchone()
            if state is None:
                return result
            run = pick(_segments(cursor, kb_id))
            if run is None:
                return result
            result += _merge(cursor, kb_id, run, int(state[1]))
            cursor.execute("UPDATE fulltext_kb_stats SET next_segment = next_segment + 1 WHERE knowledge_base_id = %s",
                           [kb_id])


def _next_run(segments: Sequence[_Segment]) -> list[_Segment] | None:
    """下一段要并的相邻段：从头累加到不超过上限为止；只有一个段（并不动）就跳到后面，没有可并的返回 None。"""
    start = 0
    while start < len(segments):
        run = [segments[start]]
        for segment in segments[start + 1:]:
            if sum(s.docs for s in run) + segment.docs > settings.FULLTEXT_MAX_SEGMENT_CHUNKS:
                break
            run.append(segment)
        if len(run) > 1:
            return run
        start += 1
    return None


def _idle_run(segments: Sequence[_Segment]) -> list[_Segment] | None:
    """闲时要并的一串段：从最新的段往前收，前一个段不超过已收的 ``_IDLE_MERGE_RATIO`` 倍（或不超过
    ``_IDLE_MERGE_FLOOR`` 个分块）、并起来也不超过 ``RAG_FULLTEXT_MAX_SEGMENT_CHUNKS`` 就收进来；不到两个段返回 None。

    比例限制写放大：零星写入留下的小段不会让一个大段一次次被整个重写（10 万块的段后面跟一个 10 块的段，不并）；
    下限让批量导入最后那一小批（几百块）不挡住前面的段。批量导入留下的分层的段（每层比下一层大约
    ``MERGE_FACTOR`` 倍、每层最多 ``MERGE_FACTOR - 1`` 个）逐个都收得进来，并成一个。"""
    run = [segments[-1]] if segments else []
    docs = sum(segment.docs for segment in run)
    for segment in reversed(segments[:-1]):
        if (segment.docs > max(_IDLE_MERGE_RATIO * docs, _IDLE_MERGE_FLOOR)
                or docs + segment.docs > settings.FULLTEXT_MAX_SEGMENT_CHUNKS):
            break
        run.insert(0, segment)
        docs += segment.docs
    return run if len(run) > 1 else None


def _merge(cursor: Any, kb_id: uuid.UUID, segments: Sequence[_Segment], segment_id: int) -> CompactResult:
    """把相邻的几个段（序号范围连成一段）并成一个新段，清掉范围里已删除分块的倒排与删除集的行。

    删除集在这条语句的快照里读：之后才提交的删除留在删除集里，查询照样过滤，下一次合并再清。
    """
    first, end = segments[0].first, segments[-1].end
    ids = [segment.segment_id for segment in segments]
    # 清除范围里的删除集；其中已折叠的，从按词计数里减回去（它们的倒排随这次合并消失，段的 df 重新按倒排算）
    cursor.execute("DELETE FROM fulltext_deleted WHERE knowledge_base_id = %s AND ordinal >= %s AND ordinal < %s"
                   " RETURNING ordinal, length, terms, folded", [kb_id, first, end])
    purged = cursor.fetchall()
    counts = _lexeme_counts(bytes(data) for _, _, data, folded in purged if folded)
    if counts:
        cursor.execute("UPDATE fulltext_deleted_terms t SET count = t.count - c.n FROM unnest(%s::text[], %s::int[])"
                       " AS c(x, n) WHERE t.knowledge_base_id = %s AND t.lexeme = c.x",
                       [list(counts), list(counts.values()), kb_id])
        cursor.execute("DELETE FROM fulltext_deleted_terms WHERE knowledge_base_id = %s AND count <= 0", [kb_id])
    gone = np.array([row[0] for row in purged], dtype=np.int64)
    docs = sum(segment.docs for segment in segments) - len(purged)
    # 按词位分片：每片读各段里这一片的词典块与倒排块，编好写出，再读下一片。新段的词典块在片的边界断开，
    # 查找一个词（first_lexeme ≤ 它的最后一块）照样找得到；按首字的 df 跨片累加，最后写
    prefixes: dict[str, int] = {}
    # 新段的长度字节从各片读到的倒排里收齐（每个留下的、有词的分块都有倒排落在某一片里）：旧段是按序号存的
    # 还是块里自带的（v7 以前写的段）都一样
    norms = np.zeros(end - first, dtype=np.uint8)
    segment_norms = _segment_norms(cursor, kb_id, ids)
    for low, high in _slices(cursor, kb_id, segments):
        lexemes, postings = _read_segments(cursor, kb_id, ids, segment_norms, low, high)
        postings = postings.without_docs(gone)
        norms[postings.docs - first] = postings.norms
        rows = build_segment(lexemes, postings)
        _write_terms(cursor, kb_id, segment_id, rows)
        for prefix, df in rows.prefixes:
            prefixes[prefix] = prefixes.get(prefix, 0) + df
    _delete_segments(cursor, kb_id, ids)
    _insert_segment(cursor, kb_id, _Segment(segment_id, first, end, docs), norms)
    _write_prefixes(cursor, kb_id, segment_id, sorted(prefixes.items()))
    if purged:
        cursor.execute("UPDATE fulltext_kb_stats SET chunk_count = chunk_count - %s,"
                       " total_length = total_length - %s WHERE knowledge_base_id = %s",
                       [len(purged), sum(int(row[1]) for row in purged), kb_id])
    return CompactResult(segments=1, merged=len(segments), purged=len(purged))


def _delete_segments(cursor: Any, kb_id: uuid.UUID, ids: Sequence[int]) -> None:
    cursor.execute("DELETE FROM fulltext_blocks WHERE knowledge_base_id = %s AND segment_id = ANY(%s)", [kb_id, ids])
    cursor.execute("DELETE FROM fulltext_dictionary WHERE knowledge_base_id = %s AND segment_id = ANY(%s)",
                   [kb_id, ids])
    cursor.execute("DELETE FROM fulltext_prefixes WHERE knowledge_base_id = %s AND segment_id = ANY(%s)",
                   [kb_id, ids])
    cursor.execute("DELETE FROM fulltext_segments WHERE knowledge_base_id = %s AND segment_id = ANY(%s)", [kb_id, ids])


# 一个段里与词位范围 [low, high) 有交集的词典块、在范围里的倒排块（None 表示那一头无界；参数是字面量，
# 规划器把 "NULL IS NULL OR …" 折成常量，主键上照样是范围扫描）
_SLICE_DICTIONARY_SQL = (
    "SELECT data FROM fulltext_dictionary d WHERE d.knowledge_base_id = %s AND d.segment_id = %s"
    " AND d.first_lexeme >= coalesce((SELECT max(first_lexeme) FROM fulltext_dictionary"
    "  WHERE knowledge_base_id = %s AND segment_id = %s AND first_lexeme <= %s::text), '')"
    " AND (%s::text IS NULL OR d.first_lexeme < %s::text)")
_SLICE_BLOCKS_SQL = (
    "SELECT lexeme, data FROM fulltext_blocks WHERE knowledge_base_id = %s AND segment_id = %s"
    " AND (%s::text IS NULL OR lexeme >= %s::text) AND (%s::text IS NULL OR lexeme < %s::text)")


def _slices(cursor: Any, kb_id: uuid.UUID, segments: Sequence[_Segment]) -> list[tuple[str | None, str | None]]:
    """并段的词位分片 [(low, high)]（low 含、high 不含，None 是无界）：约每 ``_SLICE_DOCS`` 个分块一片，
    切点在这几个段的词典块首词里等距取。词典块大小相近，一片的倒排量大致均匀。"""
    count = math.ceil(sum(segment.docs for segment in segments) / _SLICE_DOCS)
    if count <= 1:
        return [(None, None)]
    cursor.execute("SELECT DISTINCT first_lexeme FROM fulltext_dictionary WHERE knowledge_base_id = %s"
                   " AND segment_id = ANY(%s) ORDER BY first_lexeme",
                   [kb_id, [segment.segment_id for segment in segments]])
    firsts = [row[0] for row in cursor.fetchall()]
    step = max(1, len(firsts) // count)
    bounds: list[str | None] = [None, *firsts[step::step][:count - 1], None]
    return list(itertools.pairwise(bounds))


def _segment_norms(cursor: Any, kb_id: uuid.UUID, ids: Sequence[int]) -> dict[int, NormLookup | None]:
    """几个段按序号存的长度字节（v7 以前写的段为 None：块里自带）。并段按词位分片读，每片都要它们：先读一次。"""
    cursor.execute("SELECT segment_id, first_ordinal, norms FROM fulltext_segments WHERE knowledge_base_id = %s"
                   " AND segment_id = ANY(%s)", [kb_id, list(ids)])
    return {int(segment_id): None if data is None else dense_norms(int(first), np.frombuffer(data, dtype=np.uint8))
            for segment_id, first, data in cursor.fetchall()}


def _read_segments(cursor: Any, kb_id: uuid.UUID, ids: Sequence[int], norms: dict[int, NormLookup | None],
                   low: str | None = None, high: str | None = None) -> tuple[list[str], Postings]:
    """几个段里词位在 [low, high) 的倒排（不给就是全部），词位统一成一张表（下标即 ``Postings.terms``）。
    ``norms`` 是这几个段的长度字节（:func:`_segment_norms`）。

    词典块取与这一段范围有交集的：首词小于 high，且不早于首词 ≤ low 的最后一块（low 所在的那块）。"""
    parts: list[tuple[list[str], Postings]] = []
    for segment_id in ids:
        cursor.execute(_SLICE_DICTIONARY_SQL, [kb_id, segment_id, kb_id, segment_id, low, high, high])
        dictionary = [bytes(row[0]) for row in cursor.fetchall()]
        cursor.execute(_SLICE_BLOCKS_SQL, [kb_id, segment_id, low, low, high, high])
        parts.append(read_segment(dictionary, [(lexeme, bytes(data)) for lexeme, data in cursor.fetchall()],
                                  low=low, high=high, norms=norms.get(segment_id)))
    return _union(parts)


def _vocabulary(flat: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """一串词位 → (排好序、不重复的词位表, 每个词位在表里的下标)。

    上百万个词位时不走逐条的生成器：集合与排序在 C 里，换下标用字典的 ``__getitem__`` 逐个映射
    （以前这一步占合并时间的一成）。"""
    lexemes = sorted(set(flat))
    index = dict(zip(lexemes, range(len(lexemes)), strict=True))
    return lexemes, np.fromiter(map(index.__getitem__, flat), dtype=np.int32, count=len(flat))


def _union(parts: Sequence[tuple[list[str], Postings]]) -> tuple[list[str], Postings]:
    """几个段各自的 (词位表, 倒排) 并成一张词位表，倒排的词下标换成新表里的。"""
    lexemes, ids = _vocabulary(list(itertools.chain.from_iterable(part_lexemes for part_lexemes, _ in parts)))
    remapped = []
    start = 0
    for part_lexemes, postings in parts:
        mapping = ids[start:start + len(part_lexemes)]
        start += len(part_lexemes)
        remapped.append(Postings(mapping[postings.terms] if len(postings) else postings.terms, postings.docs,
                                 postings.title_tf, postings.body_tf, postings.norms))
    return lexemes, Postings.concat(remapped) if remapped else Postings.empty()


# 段的表（词典、倒排块、首字 df、序号、删除集）合计小于这么多字节时，并段之后用 VACUUM FULL 逐张重写紧凑。并段先写
# 新段、再删旧段，旧段的页只留给以后的写入复用，文件不会变小：一个摄取完就不再写的小库（cmrc2018 的 1,311 块）并成
# 一个段后，这几张表 13.7 MB 里只有 5.6 MB 是活的。VACUUM FULL 整张表重写期间都要排他锁，这个大小只锁 0.1 s 左右；
# 更大的库改用拷贝换表（:func:`_swap_merged_tables`），只在换表的一刻挡查询
REPACK_MAX_BYTES = 64 * 1024 * 1024
_SEGMENT_TABLES = ("fulltext_dictionary", "fulltext_blocks", "fulltext_prefixes", "fulltext_docs", "fulltext_segments",
                   "fulltext_deleted", "fulltext_deleted_terms")
# 只有并段（与合并，都先锁住知识库的统计行）和整库删除写的表：并段的空页全在这里（10 万块的基准库闲时并段之后词典与
# 倒排块的堆约是存活的行的两倍，bench/pages/fulltext_engine.md）。拷贝换表只换这几张；查询的快照事务开头先锁住它们
# （search.bm25._snapshot_cursor），换表时正在读的查询读完旧表、之后开始的读新表
MERGED_TABLES = ("fulltext_dictionary", "fulltext_blocks", "fulltext_prefixes")
# 表（含 TOAST）比存活的行紧凑地放下要的字节大这么多倍、且超过 INDEX_SHRINK_MIN_BYTES 时才拷贝换表：与索引的门槛相同。
# 闲时并段把全部段并成一个之后在它之上（10 万块的基准库：词典 1.9 倍、倒排块 1.8 倍），换过之后约 1.05 倍
_HEAP_BLOAT_RATIO = 1.5
# 重写（VACUUM FULL 或换表）时等锁最多这么久：等不到（有长事务在读或在写）就整个放弃，下一轮维护再来
_REPACK_LOCK_TIMEOUT = "2s"
_PAGE_BYTES = 8192
# 表 c 的堆与 TOAST 的字节（主文件）
_HEAP_BYTES_SQL = "pg_relation_size(c.oid) + coalesce(pg_relation_size(nullif(c.reltoastrelid, 0)), 0)"


def repack_tables() -> list[str]:
    """并段之后把段的表重写紧凑（并段留下的空页还给文件系统），返回重写了的表；不在调用方的事务里执行（测试里
    什么也不做）。段的表合计小于 ``REPACK_MAX_BYTES`` 时 VACUUM FULL 逐张重写；更大时只对空页多的并段表
    （:data:`MERGED_TABLES`）拷贝换表。都不改任何一行的内容。等锁超时（有长事务在用这些表）就跳过，下次再来。"""
    if connection.in_atomic_block:
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                       " WHERE c.relname = ANY(%s) AND c.relnamespace = 'public'::regnamespace",
                       [list(_SEGMENT_TABLES)])
        if int(cursor.fetchone()[0]) < REPACK_MAX_BYTES:
            return _vacuum_full(cursor)
        bloated = [table for table in MERGED_TABLES if _plain_table(cursor, table) and _heap_bloated(cursor, table)]
    if not bloated:
        return []
    try:
        _swap_merged_tables(bloated)
    except OperationalError:
        return []  # 等锁超时或死锁检测选中了这里：什么也没改，下一轮再来
    return bloated


def _vacuum_full(cursor: Any) -> list[str]:
    """段的表逐张 VACUUM FULL，返回它们；等锁超时（有长事务在用其中一张）返回 []，下一轮再来。"""
    cursor.execute(f"SET lock_timeout = '{_REPACK_LOCK_TIMEOUT}'")
    try:
        for table in _SEGMENT_TABLES:
            cursor.execute(f"VACUUM FULL {table}")
    except OperationalError:
        return []
    finally:
        cursor.execute("RESET lock_timeout")
    return list(_SEGMENT_TABLES)


def _plain_table(cursor: Any, table: str) -> bool:
    """普通的一张表才拷贝换表：运维按知识库分了区（docs/DEPLOYMENT.md）、挂了继承的子表、或装了 Citus（分布表的
    元数据记着表的 OID）时，换上的新表丢掉这些，不换（空页由之后的写入复用，或按分区各自 VACUUM FULL）。
    服务的角色删不了旧表（不是属主）或不能在 schema 里建表时也不换。"""
    cursor.execute("SELECT c.relkind = 'r' AND NOT c.relispartition"
                   " AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhparent = c.oid)"
                   " AND NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
                   " AND pg_has_role(c.relowner, 'USAGE') AND has_schema_privilege(c.relnamespace, 'CREATE')"
                   " FROM pg_class c WHERE c.oid = %s::regclass", [table])
    return bool(cursor.fetchone()[0])


def _heap_bloated(cursor: Any, table: str) -> bool:
    """表的数据（堆与 TOAST，不含空闲空间映射与可见性图这两个小附属文件）比它存活的行紧凑地放下要的字节（行本身加
    4 字节的行指针，按整页算）大 ``_HEAP_BLOAT_RATIO`` 倍以上。
    存活的行要扫一遍表（10 万块的词典约 0.1 s），所以只在并过段之后看。"""
    cursor.execute(psql.SQL("SELECT {}, x.n, x.live FROM pg_class c, (SELECT count(*) AS n,"
                            " coalesce(sum(pg_column_size(t.*)), 0) AS live FROM {} t) x WHERE c.oid = %s::regclass")
                   .format(psql.SQL(_HEAP_BYTES_SQL), psql.Identifier(table)), [table])
    size, rows, live = (int(value) for value in cursor.fetchone())
    pages = math.ceil((live + 4 * rows) / (_PAGE_BYTES - 24))  # 页头 24 字节
    return size > max(INDEX_SHRINK_MIN_BYTES, _HEAP_BLOAT_RATIO * pages * _PAGE_BYTES)


def _swap_merged_tables(tables: Sequence[str]) -> None:
    """拷贝换表：在一个事务里把 ``tables`` 各自的行按主键顺序拷进一张新表、建好主键，再删掉旧表、新表改成原名。

    - 写：先以 EXCLUSIVE 锁住知识库统计行的表——合并、并段、建统计行、整库删除都要先锁它（行锁或写），于是都等到
      换完；已在进行的等锁超时放弃。这几张表再加 SHARE 锁（挡住一切写，不挡读），拷贝出的就是换表时的全部内容。
    - 读：拷贝期间照常读旧表。换表要 ACCESS EXCLUSIVE，只等正在读的查询读完，换完新查询读新表。新表的行是这个
      事务写的，更早开始的 REPEATABLE READ 快照看不见它们：查询的快照事务因此在取快照之前先锁住这几张表
      （``search.bm25._snapshot_cursor``，PostgreSQL 文档里 LOCK 的用法），锁在换表之前的读完旧表，之后的快照
      在换表提交之后、看得见新表。
    - 表的形状照旧：``LIKE … INCLUDING ALL`` 带上列、非空、存储与压缩设置，主键在拷贝之后按原定义建、改回原名
      （``tests/search/test_engine_sql.py`` 核对库里的表与存储文件一致），属主与授权照抄（:func:`_copy_privileges`）。
      只换普通的表（:func:`_plain_table`）。这几张表没有外键、触发器与依赖它们的视图，
      引用它们的函数是 PL/pgSQL（按名字解析），预备语句在表换了之后重新规划。
    """
    quote = connection.ops.quote_name
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{_REPACK_LOCK_TIMEOUT}'")
        cursor.execute("LOCK TABLE fulltext_kb_stats IN EXCLUSIVE MODE")
        cursor.execute(f"LOCK TABLE {', '.join(map(quote, tables))} IN SHARE MODE")
        keys = {}
        for table in tables:
            cursor.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                           " WHERE conrelid = %s::regclass AND contype = 'p'", [table])
            ((name, definition),) = cursor.fetchall()
            keys[table] = name
            fresh = quote(f"{table}_repacked")
            cursor.execute(f"CREATE TABLE {fresh} (LIKE {quote(table)} INCLUDING ALL EXCLUDING INDEXES)")
            _copy_privileges(cursor, table, fresh)
            cursor.execute(psql.SQL("INSERT INTO {} SELECT * FROM {} ORDER BY {}").format(
                psql.Identifier(f"{table}_repacked"), psql.Identifier(table), psql.SQL(_key_columns(definition))))
            cursor.execute(f"ALTER TABLE {fresh} ADD CONSTRAINT {quote(f'{table}_repacked_pkey')} {definition}")
            cursor.execute(f"ANALYZE {fresh}")  # 换上去的那一刻就有统计：没有统计的表规划器按页数瞎估
        # 拷贝都做完才挡读：换表这几条语句只改目录
        cursor.execute(f"LOCK TABLE {', '.join(map(quote, tables))} IN ACCESS EXCLUSIVE MODE")
        for table, name in keys.items():
            cursor.execute(f"DROP TABLE {quote(table)}")
            cursor.execute(f"ALTER TABLE {quote(f'{table}_repacked')} RENAME TO {quote(table)}")
            cursor.execute(f"ALTER TABLE {quote(table)} RENAME CONSTRAINT {quote(f'{table}_repacked_pkey')}"
                           f" TO {quote(name)}")
    with connection.cursor() as cursor:
        for table in tables:
            # 新表的行都是一个事务写的：VACUUM 一遍设好提示位与可见性图，免得换上之后第一批查询逐页去设
            cursor.execute(f"VACUUM {quote(table)}")


def _copy_privileges(cursor: Any, table: str, fresh: str) -> None:
    """新表照旧表的属主与授权：``LIKE`` 不带这些，只读副本的连接可能是另一个只有 SELECT 授权的角色。"""
    cursor.execute("SELECT c.relowner::regrole::text, a.grantee, a.grantee::regrole::text, a.privilege_type,"
                   " a.is_grantable FROM pg_class c LEFT JOIN LATERAL aclexplode(c.relacl) a ON true"
                   " WHERE c.oid = %s::regclass", [table])
    rows = cursor.fetchall()
    quote = connection.ops.quote_name
    cursor.execute(f"ALTER TABLE {fresh} OWNER TO {quote(rows[0][0])}")
    for _, grantee_oid, grantee, privilege, grantable in rows:
        if privilege is not None:  # 授权是默认的（relacl 为 NULL）时只有一行空的
            to = "PUBLIC" if grantee_oid == 0 else quote(grantee)
            cursor.execute(f"GRANT {privilege} ON {fresh} TO {to}{' WITH GRANT OPTION' if grantable else ''}")


def _key_columns(definition: str) -> str:
    """``PRIMARY KEY (a, b, c)`` 里的列。"""
    return definition[definition.index("(") + 1:definition.rindex(")")]


# 引擎各表的索引停在批量写入与并段的高峰：B 树删掉的条目留下的空页只在 VACUUM 之后复用，GIN 更是几乎不缩，
# 文件都不会变小。三个合成库（110 万块）维护之后量过（bench/pages/fulltext_engine.md 的“索引随维护重建……”）：
# 倒排块主键每条 107 B（重建后 50）、词典主键 404（50）、首字 df 主键 893（42）；0 行的删除集 GIN 160 MB、
# 删除集按词计数的主键 76 MB、L0 的 GIN 118 MB。重建 125 MB 的倒排块主键约 1.5 s。门槛以下（空表重建后也有
# 一两页）不值得动
INDEX_SHRINK_MIN_BYTES = 1024 * 1024
# 索引比按现有的行估出的新建大小大这么多倍才重建：随机插入的 B 树稳态约 1.3 倍，并段一次（新段写完、旧段删掉）约 2 倍。
# 以前取 2：10 万块的基准库并成一个段之后倒排块主键 1.9 倍（113 对新建约 59 B/块）正好漏掉；1.5 仍在稳态之上
_INDEX_BLOAT_RATIO = 1.5
# GIN 的每行按这么宽估（L0 一行是一个分块的全部词位，GIN 把它们压进各词的条目）：eval 库 8,938 个分块摄取完 L0 空了，
# GIN 还占 12 MB；只在远大于现有的行时重建
_GIN_ROW_BYTES = 16 * 1024
# 进出频繁、平时只有几千行的表：行数直接数（统计视图跟不上合并刚清空的时候），重建索引之前先 VACUUM 把表的空页还回去
_TRANSIENT_TABLES = ("fulltext_l0", "fulltext_deleted")
# 重建时看的表：L0 与段的表
_INDEXED_TABLES = ("fulltext_l0", *_SEGMENT_TABLES)
# 同一时刻只有一个进程在重建（REINDEX CONCURRENTLY 两个一起跑时后一个只是排队等）
_SHRINK_LOCK = "search.fulltext_l0_shrink"
# 一个索引的现状：名字、所在的表、访问方法、字节数、按现有的行估出的新建大小
_INDEX_STATE_SQL = (
    "SELECT ic.relname, t.relname, am.amname, pg_relation_size(ic.oid), coalesce(s.n_live_tup, 0),"
    " array(SELECT coalesce(st.avg_width, greatest(a.attlen, 16)) FROM unnest(i.indkey::int2[]) k(attnum)"
    "       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
    "       LEFT JOIN pg_stats st ON st.schemaname = 'public' AND st.tablename = t.relname AND st.attname = a.attname)"
    " FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid"
    " JOIN pg_am am ON am.oid = ic.relam LEFT JOIN pg_stat_user_tables s ON s.relid = t.oid"
    " WHERE t.relname = ANY(%s) AND t.relnamespace = 'public'::regnamespace AND i.indisvalid ORDER BY ic.relname")


@dataclass(frozen=True)
class IndexState:
    """引擎的一个索引：字节数，与按现有的行估出的新建大小（:func:`fresh_index_bytes`）。"""

    name: str
    table: str
    size: int
    fresh: float

    @property
    def bloated(self) -> bool:
        return self.size > max(INDEX_SHRINK_MIN_BYTES, _INDEX_BLOAT_RATIO * self.fresh)


def fresh_index_bytes(method: str, rows: int, widths: Sequence[int]) -> float:
    """新建的索引装 ``rows`` 行大约要的字节。B 树的叶子条目是 8 字节的条目头加各列（``widths``，按 8 字节对齐），
    另有 4 字节的行指针，页面填到 90%（默认 fillfactor）；四个主键重建后的实测与这个估计差 4% 以内。GIN 按每行
    ``_GIN_ROW_BYTES`` 宽估（宁大勿小：只抓远大于行数的）。"""
    if method != "btree":
        return float(rows * _GIN_ROW_BYTES)
    entry = (8 + sum(widths) + 7) // 8 * 8 + 4
    return rows * entry / 0.9


def index_states() -> list[IndexState]:
    """引擎各表（L0 与段的表）的有效索引的现状。暂存的表的行数直接数，其余的取统计视图里的活行数：
    刚并过段、死行还没清时，死行的条目正是要重建掉的。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT (SELECT count(*) FROM fulltext_l0), (SELECT count(*) FROM fulltext_deleted)")
        rows = dict(zip(_TRANSIENT_TABLES, (int(n) for n in cursor.fetchone()), strict=True))
        cursor.execute(_INDEX_STATE_SQL, [list(_INDEXED_TABLES)])
        return [IndexState(name, table, int(size),
                           fresh_index_bytes(method, rows.get(table, int(live)), [int(w) for w in widths]))
                for name, table, method, size, live, widths in cursor.fetchall()]


def shrink_indexes() -> tuple[int, int] | None:
    """把引擎各表停在高峰的索引重建回去（``REINDEX INDEX CONCURRENTLY``，不挡写入与查询）：批量写入之后 L0 与删除集
    空了，GIN 还停在高峰（eval 库 1.2 万个分块转完后 L0 的 GIN 还占 19 MB，重建后 16 KB）；并段写新段、删旧段，
    段的表的 B 树主键留下大半空页。CONCURRENTLY 要等开始之前的事务结束，所以由维护队列上的定时任务执行
    （``ops.tasks.maintain_fulltext``），不放在合并里。

    只重建比按现有的行估出的新建大小大得多的索引（:class:`IndexState`）；暂存的表（L0、删除集）重建之前先 VACUUM。
    别的进程正在重建时跳过。上一次 REINDEX CONCURRENTLY 中途被杀会留下无效的 ``*_ccnew`` 索引（写入还要维护它），
    先删掉。VACUUM 与 REINDEX CONCURRENTLY 不能在事务里执行：调用方在事务里（测试）时什么也不做。重建了就返回
    这些索引（与先 VACUUM 的表）之前、之后的字节数，否则 None。"""
    if connection.in_atomic_block:
        return None
    with advisory_lock(_SHRINK_LOCK) as acquired:
        if not acquired:
            return None
        with connection.cursor() as cursor:
            cursor.execute("SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                           " JOIN pg_class t ON t.oid = i.indrelid WHERE t.relname = ANY(%s)"
                           " AND t.relnamespace = 'public'::regnamespace AND NOT i.indisvalid"
                           " AND c.relname ~ '_cc(new|old)[0-9]*$'", [list(_INDEXED_TABLES)])
            for (name,) in cursor.fetchall():
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {connection.ops.quote_name(name)}")
            chosen = [state for state in index_states() if state.bloated]
            if not chosen:
                return None
            vacuumed = sorted({state.table for state in chosen} & set(_TRANSIENT_TABLES))
            before = sum(state.size for state in chosen) + sum(_heap_bytes(cursor, table) for table in vacuumed)
            for table in vacuumed:
                cursor.execute(f"VACUUM {table}")
            for state in chosen:
                cursor.execute(f"REINDEX INDEX CONCURRENTLY {connection.ops.quote_name(state.name)}")
            cursor.execute("SELECT coalesce(sum(pg_relation_size(c.oid)), 0) FROM pg_class c"
                           " WHERE c.relname = ANY(%s) AND c.relnamespace = 'public'::regnamespace",
                           [[state.name for state in chosen]])
            after = int(cursor.fetchone()[0]) + sum(_heap_bytes(cursor, table) for table in vacuumed)
    return before, after


def _heap_bytes(cursor: Any, table: str) -> int:
    """表本身（不含索引）的字节数。"""
    cursor.execute("SELECT pg_table_size(%s)", [table])
    return int(cursor.fetchone()[0])


# ---------------------------------------------------------------- 整库删除、重建、核对


def drop(kb_id: uuid.UUID, *, batch_segments: int = 20) -> int:
    """整库清理的快路：分批删掉知识库的段（倒排块与词典块）与序号表，最后删统计行；返回删掉的段数。

    统计行不在时触发器对这个知识库的删除什么也不做（``search/sql/fulltext_stats_maintain.v2.sql``），之后逐批删分块
    不再逐个查找全文数据。统计行上的触发器（``fulltext_kb_stats_dropped``）删掉剩下的行（L0、删除集，以及这期间
    新写入的）。删完之后才写入的分块会重新建起统计行，所以清理结束时要再调一次。
    """
    deleted = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT segment_id FROM fulltext_segments WHERE knowledge_base_id = %s"
                           " ORDER BY segment_id LIMIT %s", [kb_id, batch_segments])
            ids = [int(row[0]) for row in cursor.fetchall()]
            if not ids:
                break
            _delete_segments(cursor, kb_id, ids)
            deleted += len(ids)
    with transaction.atomic(), connection.cursor() as cursor:
        # 先锁住统计行：正在提交的合并先做完，再删
        cursor.execute("SELECT 1 FROM fulltext_kb_stats WHERE knowledge_base_id = %s FOR UPDATE", [kb_id])
        cursor.execute("DELETE FROM fulltext_kb_stats WHERE knowledge_base_id = %s", [kb_id])
    return deleted


def rebuild(kb_id: uuid.UUID) -> CompactResult:
    """从分块的原文重建一个知识库的全部全文数据：整库删除，按当前的切词设置重新登记每个分块，再合并成段。

    引擎不存分块的 tsvector，重建的依据就是原文（与 ``manage.py rebuild_fulltext`` 改切法之后做的相同，
    :func:`search.chunk_terms.reindex_chunks`）。重新登记分批提交，期间写入、删除的分块照常经过触发器，不会丢，
    也不会多：整库删除之后第一个重新登记的分块建起统计行，之后每个分块先撤出（不在引擎里就什么也不做）再登记。
    """
    drop(kb_id)
    reindex_chunks(kb_id=kb_id)
    with connection.cursor() as cursor:
        # 一次放进成千上万行之后 L0 的统计还是放之前的（常常是空表）：接下来合并取一批行的语句按它做计划，
        # 100 万行刚放进、自动 ANALYZE 之前，第一批 2 万行跑了 12 分钟还没完；ANALYZE 之后每批 19 s
        cursor.execute("ANALYZE fulltext_l0")
    return compact(kb_id)


def mismatches(kb_id: uuid.UUID) -> list[str]:
    """全文数据内部、以及与分块行之间的差异（人能读的描述）；空列表表示完全一致。

    分块的词项只在引擎里：L0 的行、已合并分块的正排（``fulltext_docs.terms``）。以它们为准比较：可见的倒排（段里的
    减去删除集）与已合并分块的正排逐条相同（词频封顶、长度量化之后）；每个词的 df（各段词典 + L0 - 删除集）等于
    按 L0 与正排重数的；N 与总词数（统计行 + L0 - 删除集）等于分块行上的（``search_length``），每个分块登记的
    词数就是它行上的。另外检查每个可检索分块恰好在 L0 或序号表里出现一次、记着的文档就是它所属的文档，删除集的
    按词计数等于已折叠的那些行。不与原文重新切词比较：改了切词设置、还没 ``rebuild_fulltext`` 时两者本来就不同。
    """
    problems: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT chunk_count, total_length FROM fulltext_kb_stats WHERE knowledge_base_id = %s",
                       [kb_id])
        state = cursor.fetchone()
        cursor.execute("SELECT id, coalesce(search_length, 0) FROM document_chunks"
                       " WHERE knowledge_base_id = %s AND role <> 'parent'", [kb_id])
        chunks = {int(chunk_id): int(length) for chunk_id, length in cursor.fetchall()}
        if state is None:
            return [f"{len(chunks)} searchable chunks but no statistics row"] if chunks else []
        cursor.execute("SELECT chunk_id, length, lexemes, title_tf, body_tf FROM fulltext_l0"
                       " WHERE knowledge_base_id = %s", [kb_id])
        l0 = cursor.fetchall()
        cursor.execute("SELECT ordinal, chunk_id, length, terms FROM fulltext_docs WHERE knowledge_base_id = %s",
                       [kb_id])
        rows = cursor.fetchall()
        docs = {int(o): (int(c), int(n)) for o, c, n, _ in rows}
        merged = [(int(chunk), int(length), *_forward_columns(bytes(data))) for _, chunk, length, data in rows]
        cursor.execute("SELECT x.chunk_id FROM (SELECT chunk_id, document_id FROM fulltext_l0"
                       " WHERE knowledge_base_id = %s UNION ALL SELECT chunk_id, document_id FROM fulltext_docs"
                       " WHERE knowledge_base_id = %s) x LEFT JOIN document_chunks c ON c.id = x.chunk_id"
                       " WHERE c.document_id IS DISTINCT FROM x.document_id ORDER BY 1 LIMIT 20", [kb_id, kb_id])
        problems += [f"chunk {chunk_id} indexed under another document" for (chunk_id,) in cursor.fetchall()]
        cursor.execute("SELECT ordinal, length, terms, folded FROM fulltext_deleted WHERE knowledge_base_id = %s",
                       [kb_id])
        deleted = [(int(o), int(n), forward.decode(bytes(data)).lexemes, folded) for o, n, data, folded
                   in cursor.fetchall()]
        ids = [s.segment_id for s in _segments(cursor, kb_id)]
        lexemes, postings = _read_segments(cursor, kb_id, ids, _segment_norms(cursor, kb_id, ids))
        dictionary_dfs = _dictionary_dfs(cursor, kb_id)
        cursor.execute("SELECT prefix, sum(df) FROM fulltext_prefixes WHERE knowledge_base_id = %s GROUP BY prefix",
                       [kb_id])
        stored_prefixes = {prefix: int(df) for prefix, df in cursor.fetchall()}
        cursor.execute("SELECT lexeme, count FROM fulltext_deleted_terms WHERE knowledge_base_id = %s", [kb_id])
        folded_terms = {lexeme: int(count) for lexeme, count in cursor.fetchall()}
    folded_counts: dict[str, int] = {}
    for _, _, names, folded in deleted:
        for lexeme in names if folded else ():
            folded_counts[lexeme] = folded_counts.get(lexeme, 0) + 1
    if folded_terms != folded_counts:
        problems.append("fulltext_deleted_terms != the folded rows of fulltext_deleted")
    ordered = sorted(dictionary_dfs.items())
    summed = dict(prefix_dfs([lexeme for lexeme, _ in ordered], [df for _, df in ordered]))
    problems += [f"prefix df({prefix!r}) stored {stored_prefixes.get(prefix)} != dictionary {summed.get(prefix)}"
                 for prefix in sorted(set(stored_prefixes) | set(summed))
                 if stored_prefixes.get(prefix) != summed.get(prefix)][:20]
    indexed = [(int(row[0]), int(row[1])) for row in l0] + [(chunk, length) for chunk, length, *_ in merged]
    if sorted(chunk for chunk, _ in indexed) != sorted(chunks):
        problems.append(f"indexed chunks {len(indexed)} (distinct {len({c for c, _ in indexed})}) != searchable"
                        f" chunks {len(chunks)}")
    problems += [f"chunk {chunk} indexed with length {length} != its search_length {chunks[chunk]}"
                 for chunk, length in indexed if chunk in chunks and chunks[chunk] != length][:20]
    live = postings.without_docs(np.array([row[0] for row in deleted], dtype=np.int64))
    stored = {(docs.get(doc, (None, 0))[0], lexemes[term], title, body, norm) for term, doc, title, body, norm
              in zip(live.terms.tolist(), live.docs.tolist(), live.title_tf.tolist(), live.body_tf.tolist(),
                     live.norms.tolist(), strict=True)}
    counted = _posting_set(merged)
    problems += [f"posting {row!r} stored but not counted" for row in sorted(stored - counted, key=repr)[:20]]
    problems += [f"posting {row!r} counted but not stored" for row in sorted(counted - stored, key=repr)[:20]]
    n = int(state[0]) + len(l0) - len(deleted)
    total = int(state[1]) + sum(int(row[1]) for row in l0) - sum(row[1] for row in deleted)
    if (n, total) != (len(chunks), sum(chunks.values())):
        problems.append(f"chunks/length stored {(n, total)} != counted {(len(chunks), sum(chunks.values()))}")
    dfs = dict(dictionary_dfs)
    for row in l0:
        for lexeme in row[2]:
            dfs[lexeme] = dfs.get(lexeme, 0) + 1
    for _, _, names, _ in deleted:
        for lexeme in names:
            dfs[lexeme] = dfs.get(lexeme, 0) - 1
    recount: dict[str, int] = {}
    for names in [row[2] for row in l0] + [row[2] for row in merged]:
        for lexeme in names:
            recount[lexeme] = recount.get(lexeme, 0) + 1
    for lexeme in sorted(set(dfs) | set(recount)):
        if dfs.get(lexeme, 0) != recount.get(lexeme, 0):
            problems.append(f"df({lexeme!r}) stored {dfs.get(lexeme, 0)} != counted {recount.get(lexeme, 0)}")
    return problems


def _forward_columns(data: bytes) -> tuple[list[str], list[int], list[int]]:
    """正排 → (词位, 标题词频, 正文词频)，与 L0 的三列同形。"""
    terms = forward.decode(data)
    return terms.lexemes, list(terms.title_tf), list(terms.body_tf)


def _posting_set(rows: Sequence[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """(分块 id, 词位, 标题词频, 正文词频, 长度字节)，词频封顶、长度量化，与段里存的口径相同。"""
    result = set()
    for chunk_id, length, lexemes, titles, bodies in rows:
        norm = int(norm_bytes(np.array([length]))[0])
        for lexeme, title, body in zip(lexemes, titles, bodies, strict=True):
            result.add((int(chunk_id), lexeme, capped_tf(title), capped_tf(body), norm))
    return result


def _dictionary_dfs(cursor: Any, kb_id: uuid.UUID) -> dict[str, int]:
    """各段词典里记的 df 之和（含删除集里的分块）。"""
    cursor.execute("SELECT data FROM fulltext_dictionary WHERE knowledge_base_id = %s", [kb_id])
    dfs: dict[str, int] = {}
    for (data,) in cursor.fetchall():
        for entry in decode_dictionary_block(bytes(data)):
            dfs[entry.lexeme] = dfs.get(entry.lexeme, 0) + entry.df
    return dfs
