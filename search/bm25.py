"""PostgreSQL 里的 BM25：全文引擎的 PostgreSQL 实现（:class:`PostgresFulltextEngine`）的读侧——统计、打分与检索。
接口与 SQL 文件的布局见 :mod:`search.fulltext`，写侧（L0 合并成段、并段、删除、重建、核对）见 :mod:`search.segments`，
打分公式与纯函数见 :mod:`raglib.bm25`、:mod:`raglib.postings`。

- ``tf_t``：词 t 在分块里的加权次数：正文出现一次记 1，标题部分（文件名、文档标题、标题路径）记
  ``RAG_BM25_TITLE_WEIGHT``；倒排分别存标题与正文的次数（各一个字节），权重在查询时才乘，改权重不用重建；
- ``dl``：分块的词数，倒排里存成一个字节（Lucene 的 SmallFloat 量化），打分用量化后的值；
- ``N``、``avgdl``、``df_t``：段里的（统计行与各段词典）+ L0 的 - 删除集的，在同一个快照里读出，
  所以永远与分块一致，写入也不必更新任何共享的行。

一次查询（都在一个 REPEATABLE READ 只读事务里，合并在中途提交也看不到半个段）：

1. 统计行与 L0、删除集的计数、快照里的段；各段词典里查询词的条目（每段每词一个，前缀词是一段），取自进程内的
   段词典缓存（:mod:`search.segment_cache`：精确词的条目、词典块），缺的才查库；
2. L0 里含查询词的分块的词频（GIN 索引），删除集的序号（统计行上的计数为 0 时都不读）；
3. 由 df 算 IDF，按 :func:`raglib.bm25.allot_postings` 把 ``RAG_BM25_MAX_POSTINGS`` 条的读取额度分给各词：
   稀有词整条读（多半已内联在词典里），常见词只读影响力最高的几块；
4. 倒排块先看段缓存（常见词影响力最高的几块多半在里面），缺的按二进制结果格式取回（bytea 不经十六进制文本），
   在服务里用 numpy 解码、打分（:func:`raglib.postings.bm25_scores`），去掉删除集，取前若干名换成分块 id，
   再回表检查检索范围（状态、过滤条件）：没有过滤条件时先查 limit 个，不够再查下一批。

每个查询都走的几条语句（统计行、回表、取倒排块）是预备语句（:func:`infra.routers.fetchall_prepared`），
每个连接上规划一次。

**合并完的库走一条语句**：上一个查询看到这个库 L0 与删除集都空时，段缓存记下它的统计行与段表
（:class:`search.segment_cache.SettledState`）。之后的普通查询（没有过滤条件、不是短语 / 布尔 / exact）不开事务、
不读统计行，按记下的统计做 1~4 步（词典与倒排多半都在段缓存里，缺的照样取：段不变，读到的还是那些段的），
回表的那条语句在它自己的快照里同时核对记下的状态仍然成立；不成立就作废这一遍、在快照里重查
（docs/INVARIANTS.md 的 SETTLED-STATE-CHECKED）。热缓存时一个查询只剩这一次往返。

各词的 df 之和不超过额度时（小知识库、具体的问题）结果与全量打分完全相同。
"""

from __future__ import annotations

import functools
import math
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from psycopg import IsolationLevel
from psycopg.pq import TransactionStatus

from infra.routers import fetchall_prepared, search_connection
from raglib import forward
from raglib.analysis import ParsedQuery, QueryTerm, quote_lexeme
from raglib.bm25 import Bm25Params, TermRead, allot_postings, chunk_score, coverage, max_score, score_terms
from raglib.lexicon import Entry
from raglib.postings import (
    BLOCK_SIZE,
    NormLookup,
    Postings,
    bm25_scores,
    capped_tf,
    decode_blocks,
    decode_joined,
    impacts,
    norm_bytes,
    quantised_length,
)
from search import segments
from search.chunk_terms import matching, reanalysed, reindex_chunks, satisfying
from search.fulltext import Bm25Statistics, ChunkScope, FulltextHits, PathHit
from search.segment_cache import DICTIONARIES, PREFIX_END, SettledState, StaleSegments

# ---------------------------------------------------------------- 一个快照里的统计与候选


@dataclass(frozen=True)
class _Snapshot:
    """一次查询在一个快照里读到的东西：统计，各查询词在各段词典里的条目，L0 里的词频，删除集的序号。"""

    statistics: Bm25Statistics
    # 快照里的段：(段号, 代号)，按段号
    segments: list[tuple[int, int]]
    # (词位, 前缀?) → [(段号, 词典条目)]：精确词的，读快照时取；前缀词的条目在确定要读它的倒排时才取（不在这里）
    entries: dict[tuple[str, bool], list[tuple[int, Entry]]]
    # L0 里含查询词的行，按词位：[(分块 id, 词数, 标题词频, 正文词频)]
    l0: dict[str, list[tuple[int, int, int, int]]]
    deleted: np.ndarray


_LOCK_MERGED_TABLES_SQL = f"LOCK TABLE {', '.join(segments.MERGED_TABLES)} IN ACCESS SHARE MODE"


@contextmanager
def _snapshot_cursor() -> Iterator[Any]:
    """检索连接上的一个 REPEATABLE READ 只读事务：统计、词典与倒排出自同一个快照，合并在中途提交也看不到半个段。
    已在外层事务里时（测试、调用方自己开的事务）沿用外层的快照。

    隔离级别写进 BEGIN（psycopg 连接的 ``isolation_level`` / ``read_only``，事务开始时拼成
    ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY``），而不是 BEGIN 之后再发一条 ``SET TRANSACTION``：
    全文一路一次查询只有三四次往返，这一次约占 0.15 ms。出了这个事务立刻改回连接原来的设置，
    同一线程上后面的事务（写入）不受影响。

    事务的第一条语句锁住并段的表（``LOCK TABLE … IN ACCESS SHARE MODE``，不取快照、不挡任何读写，多一次往返约
    0.1 ms；合并完的库上的普通查询不走这里）：维护任务拷贝换表（:func:`search.segments.repack_tables`）时，
    查询要么在换表之前锁到旧表、整个读旧表，要么等换完再取快照、读新表。
    """
    conn = search_connection()
    raw, previous = None, (None, None)
    if not conn.in_atomic_block:
        conn.ensure_connection()
        raw = conn.connection
        previous = raw.isolation_level, raw.read_only
        raw.isolation_level, raw.read_only = IsolationLevel.REPEATABLE_READ, True
    try:
        with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
            if raw is not None:
                # 取快照之前先锁：早于换表的快照去读换上的新表会什么也看不见（新表的行是换表的事务写的）
                cursor.execute(_LOCK_MERGED_TABLES_SQL)
            yield cursor
    finally:
        # 连接断了（状态不是空闲）时它不会再被用：Django 会换新连接，新连接的设置本来就是默认的
        if raw is not None and raw.info.transaction_status == TransactionStatus.IDLE:
            raw.isolation_level, raw.read_only = previous


def _l0_rows(l0: dict[str, list[tuple[int, int, int, int]]],
             key: tuple[str, bool]) -> list[tuple[str, list[tuple[int, int, int, int]]]]:
    """L0 里一个查询词命中的 (词位, 各分块的行)：精确词一个词位，前缀词是以它开头的各词位。"""
    if not key[1]:
        return [(key[0], l0[key[0]])] if key[0] in l0 else []
    return [(lexeme, rows) for lexeme, rows in l0.items() if lexeme.startswith(key[0])]


def _statistics_row(cursor: Any, kb_id: uuid.UUID) -> tuple[Any, ...] | None:
    """统计行：(分块数, 总词数, L0 行数, L0 词数, 删除集行数, 删除集词数, [[段号, 代号], …])；库还没有统计行时 None。"""
    # 每个查询都走的语句：预备语句（infra.routers.fetchall_prepared），省去每次的解析与规划
    rows = fetchall_prepared(
        cursor.db,
        "SELECT s.chunk_count, s.total_length,"
        " (SELECT count(*) FROM fulltext_l0 l WHERE l.knowledge_base_id = s.knowledge_base_id),"
        " (SELECT coalesce(sum(length), 0) FROM fulltext_l0 l WHERE l.knowledge_base_id = s.knowledge_base_id),"
        " (SELECT count(*) FROM fulltext_deleted d WHERE d.knowledge_base_id = s.knowledge_base_id),"
        " (SELECT coalesce(sum(length), 0) FROM fulltext_deleted d WHERE d.knowledge_base_id = s.knowledge_base_id),"
        " (SELECT array_agg(ARRAY[g.segment_id::bigint, g.generation] ORDER BY g.segment_id) FROM fulltext_segments g"
        "  WHERE g.knowledge_base_id = s.knowledge_base_id)"
        " FROM fulltext_kb_stats s WHERE s.knowledge_base_id = %s::uuid", [kb_id])
    return rows[0] if rows else None


def _read_snapshot(cursor: Any, kb_id: uuid.UUID, terms: Sequence[QueryTerm],
                   settled: SettledState | None = None) -> _Snapshot:
    """统计、各查询词的 df 与词典条目，L0 与删除集里的查询词。

    ``settled`` 给出时不读统计行，当它就是统计行（L0 与删除集都空），由调用方在回表的语句里核对它还成立
    （``_in_scope``）；否则读出来，顺带记下（或忘掉）这个库合并完的状态，给下一个查询用。
    """
    keys = list(dict.fromkeys((t.lexeme, t.prefix) for t in terms))
    exact = [lexeme for lexeme, prefix in keys if not prefix]
    prefixes = [lexeme for lexeme, prefix in keys if prefix]
    row = (settled.chunk_count, settled.total_length, 0, 0, 0, 0, settled.segments) if settled is not None \
        else _statistics_row(cursor, kb_id)
    if row is None:
        DICTIONARIES.remember_settled(kb_id, None)
        return _Snapshot(Bm25Statistics(0, 0.0, {}), [], {}, {}, np.zeros(0, dtype=np.int64))
    segments = [(int(segment_id), int(generation)) for segment_id, generation in row[6] or []]
    if settled is None:
        DICTIONARIES.remember_settled(kb_id, SettledState(int(row[0]), int(row[1]), tuple(segments))
                                      if not row[2] and not row[4] else None)
    n = int(row[0]) + int(row[2]) - int(row[4])
    total = int(row[1]) + int(row[3]) - int(row[5])
    # 精确词的词典条目现在就读（每段一块）；前缀词只读按首字汇总的 df，条目等确定要读它的倒排时再取
    entries = DICTIONARIES.entries(cursor, kb_id, segments, [key for key in keys if not key[1]])
    segment_dfs: dict[tuple[str, bool], int] = {key: sum(entry.df for _, entry in found)
                                                for key, found in entries.items()}
    if prefixes:
        segment_dfs.update({(prefix, True): df
                            for prefix, df in DICTIONARIES.prefix_dfs(cursor, kb_id, segments, prefixes).items()})
    # L0 与删除集：统计行的计数为 0 时不读（合并刚做完的库两者都空，省两次往返）
    l0 = _l0_terms(cursor, kb_id, exact, prefixes) if int(row[2]) else {}
    deleted = np.zeros(0, dtype=np.int64)
    removed: dict[tuple[str, bool], int] = {}
    if int(row[4]):
        deleted, removed = _deleted_terms(cursor, kb_id, exact, prefixes)
    dfs: dict[tuple[str, bool], int] = {}
    for key in keys:
        df = segment_dfs.get(key, 0) - removed.get(key, 0)
        df += sum(len(rows) for _, rows in _l0_rows(l0, key))
        if df > 0:
            dfs[key] = df
    statistics = Bm25Statistics(n, total / n if n > 0 else 0.0, dfs) if n > 0 else Bm25Statistics(0, 0.0, {})
    return _Snapshot(statistics, segments, entries, l0, deleted)


def _l0_terms(cursor: Any, kb_id: uuid.UUID, exact: list[str],
              prefixes: list[str]) -> dict[str, list[tuple[int, int, int, int]]]:
    """L0 里含查询词的行，按词位分组：GIN 找含某个精确词的行；有前缀词时 L0 整个读（它只有几百到几千行）。"""
    cursor.execute(
        # 查询词是一张表，与展开的词位做哈希连接：长问题有五六十个词，“= ANY(数组)”要逐个比较
        "SELECT u.lexeme, l.chunk_id, l.length, u.title_tf, u.body_tf FROM fulltext_l0 l"
        " CROSS JOIN LATERAL unnest(l.lexemes, l.title_tf, l.body_tf) AS u(lexeme, title_tf, body_tf)"
        " WHERE l.knowledge_base_id = %s AND (l.lexemes && %s::text[] OR %s)"
        " AND (u.lexeme IN (SELECT unnest(%s::text[]))"
        " OR EXISTS (SELECT 1 FROM unnest(%s::text[]) p WHERE starts_with(u.lexeme, p)))",
        [kb_id, exact, bool(prefixes), exact, prefixes],
    )
    l0: dict[str, list[tuple[int, int, int, int]]] = {}
    for lexeme, chunk_id, length, title, body in cursor.fetchall():
        l0.setdefault(lexeme, []).append((int(chunk_id), int(length), int(title), int(body)))
    return l0


def _deleted_terms(cursor: Any, kb_id: uuid.UUID, exact: list[str],
                   prefixes: list[str]) -> tuple[np.ndarray, dict[tuple[str, bool], int]]:
    """删除集：全部序号，以及每个查询词在其中出现的次数（从 df 里减掉）。"""
    # 全部序号走主键上的仅索引扫描（并段清除之前删除集可以有几千行，不读它们的堆）；还没折叠的行（最近的删除，
    # 通常几十个）另按部分索引取正排。一条语句
    cursor.execute("SELECT ordinal, NULL::bytea FROM fulltext_deleted WHERE knowledge_base_id = %s"
                   " UNION ALL SELECT NULL, terms FROM fulltext_deleted WHERE knowledge_base_id = %s AND NOT folded",
                   [kb_id, kb_id])
    rows = cursor.fetchall()
    deleted = np.array(sorted(int(row[0]) for row in rows if row[0] is not None), dtype=np.int64)
    removed: dict[tuple[str, bool], int] = {}
    if not len(deleted):
        return deleted, removed
    # 已折叠的：按词计数表上的主键查找（前缀词是一段范围）
    cursor.execute(
        "SELECT t.lexeme, false, t.count FROM fulltext_deleted_terms t"
        " WHERE t.knowledge_base_id = %s AND t.lexeme = ANY(%s::text[])"
        " UNION ALL SELECT p.low, true, (SELECT coalesce(sum(t.count), 0) FROM fulltext_deleted_terms t"
        "  WHERE t.knowledge_base_id = %s AND t.lexeme >= p.low AND t.lexeme < p.low || %s)"
        "  FROM unnest(%s::text[]) p(low)",
        [kb_id, exact, kb_id, PREFIX_END, prefixes])
    for lexeme, prefix, count in cursor.fetchall():
        removed[(lexeme, bool(prefix))] = removed.get((lexeme, bool(prefix)), 0) + int(count)
    # 还没折叠的：逐行解码正排数（正排在 SQL 里解不开；同一个正排在进程里只解一次）
    for data in (row[1] for row in rows if row[1] is not None):
        lexemes = _deleted_lexemes(bytes(data))
        for lexeme in exact:
            if lexeme in lexemes:
                removed[(lexeme, False)] = removed.get((lexeme, False), 0) + 1
        for prefix in prefixes:
            count = sum(1 for lexeme in lexemes if lexeme.startswith(prefix))
            if count:
                removed[(prefix, True)] = removed.get((prefix, True), 0) + count
    return deleted, removed


@functools.lru_cache(maxsize=4096)
def _deleted_lexemes(data: bytes) -> frozenset[str]:
    """删除集里一个正排的词位。按正排的内容缓存（序号在整库重建后会重用，内容不会认错）：还没折叠的删除在下一次合并
    之前每个查询都要数一遍，解码一个约 30 µs，缓存里的只要一次哈希。还没折叠的删除通常只有几十个（每次合并都折叠），
    4,096 个够用；一个约 200 个词位的集合占 10~20 KB，上限约 80 MB。"""
    return frozenset(forward.decode(data).lexemes)


def load_statistics(kb_id: uuid.UUID, terms: Sequence[QueryTerm]) -> Bm25Statistics:
    """知识库的分块数 N、平均词数 avgdl 与各查询词的 df（键为 (词位, 前缀?)）。

    前缀词的“df”是以它开头的各词位 df 之和，也就是那一段倒排的条数（读它要花的工作量）；它可能超过 N，
    算 IDF 时由 :func:`raglib.bm25.idf` 截到 N。
    """
    with _snapshot_cursor() as cursor:
        return _read_snapshot(cursor, kb_id, terms).statistics


# ---------------------------------------------------------------- 检索：BM25 与 ts_rank_cd


def _bm25_params() -> Bm25Params:
    return Bm25Params(settings.BM25_K1, settings.BM25_B, settings.BM25_TITLE_WEIGHT)


def chunk_scores(kb_id: uuid.UUID, query: ParsedQuery, chunk_ids: Sequence[int],
                 statistics: Bm25Statistics) -> dict[int, float]:
    """知识库里指定分块在这个查询上的完整 BM25 分（不截断倒排），由分块自己的正排算出；一个查询词都没有的分块为 0。

    全文一路只返回前若干名，混合检索的候选里总有它没列出的分块：给它们补上真实的分数，而不是借用名单里
    别的分块的分数（见 docs/INVARIANTS.md 的 EVIDENCE-OWN）。与倒排表上的打分同一个公式
    （:func:`raglib.bm25.chunk_score`）。词频取自引擎登记的词项：已合并的分块是序号表里的正排（解码一个约 30 µs），
    还在 L0 的是 L0 的行，一条语句、一个快照里读出；不在引擎里的分块（父块）为 0。
    """
    scores = dict.fromkeys(chunk_ids, 0.0)
    params = _bm25_params()
    terms = score_terms(query.terms, statistics.dfs, statistics.n, params)
    if not terms or not chunk_ids:
        return scores
    exact = [t.term.lexeme for t in terms if not t.term.prefix]
    prefixes = [t.term.lexeme for t in terms if t.term.prefix]
    with search_connection().cursor() as cursor:
        registered = _registered_terms(cursor, kb_id, chunk_ids)
    for chunk_id, (length, chunk_terms) in registered.items():
        found = chunk_terms.select(exact, prefixes)
        if found:
            # 与段里存的口径相同：词频各封顶在一个字节（正排本来就截过），长度取量化后的值，
            # 两条路给同一个分块的分数才一致
            scores[chunk_id] = chunk_score(terms, found, quantised_length(length), params, statistics.avgdl)
    return scores


def _registered_terms(cursor: Any, kb_id: uuid.UUID,
                      chunk_ids: Sequence[int]) -> dict[int, tuple[int, forward.ForwardTerms]]:
    """这些分块登记在引擎里的 (词数, 词项)：已合并的解码序号表里的正排（约 30 µs 一个），还在 L0 的取 L0 的行；
    一条语句、一个快照。不在引擎里的分块（父块、已删）不出现。"""
    cursor.execute(
        "SELECT chunk_id, length, terms, NULL::text[], NULL::int2[], NULL::int2[] FROM fulltext_docs"
        " WHERE knowledge_base_id = %s AND chunk_id = ANY(%s::bigint[])"
        " UNION ALL SELECT chunk_id, length, NULL, lexemes, title_tf, body_tf FROM fulltext_l0"
        " WHERE knowledge_base_id = %s AND chunk_id = ANY(%s::bigint[])",
        [kb_id, list(chunk_ids), kb_id, list(chunk_ids)])
    return {int(chunk_id): (int(length), forward.decode(bytes(data)) if data is not None
                            else forward.ForwardTerms.from_columns(lexemes, titles, bodies))
            for chunk_id, length, data, lexemes, titles, bodies in cursor.fetchall()}


def _matching(cursor: Any, kb_id: uuid.UUID, chunk_ids: Sequence[int], tsquery: str) -> set[int]:
    """这些分块里满足 tsquery 的。没有短语算符（``<->``、``<N>``）的 tsquery 只看词在不在：用引擎登记的词项拼成
    不带位置的 tsvector 判断（解码一个正排约 30 µs）；有短语算符的要位置，对原文重新切词（约 0.3 ms 一块，
    :func:`search.chunk_terms.matching`）。词位里带 ``<`` 的查询也走重新切词：慢一些，结果一样。"""
    if "<" in tsquery:
        return matching(cursor, chunk_ids, tsquery)
    registered = _registered_terms(cursor, kb_id, chunk_ids)
    return satisfying(cursor, {chunk_id: " ".join(map(quote_lexeme, terms.lexemes))
                               for chunk_id, (_, terms) in registered.items()}, tsquery)


def _match_sql(query: ParsedQuery, scope: ChunkScope) -> tuple[str, list[Any]]:
    """回表时的命中条件（不含 tsquery 本身）：检索范围 + exact 查询的原文包含。"""
    sql, params = scope.sql, list(scope.params)
    if query.type == "exact":
        sql += "".join(" AND strpos(lower(c.chunk_text), lower(%s)) > 0" for _ in query.phrases)
        params += list(query.phrases)
    return sql, params


def _ts_rank_cd_search(kb_id: uuid.UUID, query: ParsedQuery, scope: ChunkScope, limit: int) -> list[PathHit]:
    """``ts_rank_cd``（标题 A 权重、正文 B 权重；标志 32 归一到 0~1）：规格点名的排序，没有 IDF 与长度归一。

    ``ts_rank_cd`` 要词的位置，分块不存 tsvector：取 BM25 的前 ``_TS_RANK_CD_CANDIDATES`` 个候选（已满足 tsquery、
    在范围内），对原文重新切词，在这些候选上按 ``ts_rank_cd`` 重排。命中不到这么多的库（小库，这种排序适合的场合）
    与以前逐块扫全库的结果相同；大库上是 BM25 前若干名的重排，每个查询要切几百上千个分块（约 0.3 ms 一个），只适合对照。
    """
    candidates, _ = _bm25_search(kb_id, query, scope, _TS_RANK_CD_CANDIDATES)
    if not candidates:
        return []
    with search_connection().cursor() as cursor:
        vectors = reanalysed(cursor, [hit.chunk_id for hit in candidates])
        # 排序用 rank_tsquery（phrase 查询里可选的词只抬高排名，不决定是否命中）
        cursor.execute("SELECT v.id, ts_rank_cd(v.sv::tsvector, %s::tsquery, 32) AS rank"
                       " FROM unnest(%s::bigint[], %s::text[]) AS v(id, sv) ORDER BY rank DESC, v.id LIMIT %s",
                       [query.rank_tsquery or query.tsquery, list(vectors), list(vectors.values()), limit])
        rows = cursor.fetchall()
    return [PathHit(int(chunk_id), float(rank)) for chunk_id, rank in rows]


# ts_rank_cd 排序在 BM25 的前这么多个候选上重排（见 _ts_rank_cd_search）
_TS_RANK_CD_CANDIDATES = 1000


def _bm25_search(kb_id: uuid.UUID, query: ParsedQuery, scope: ChunkScope,
                 limit: int) -> tuple[list[PathHit], Bm25Statistics]:
    """BM25：按读取额度取各查询词的倒排（段 + L0），numpy 打分，去掉删除集，前若干名回表检查范围。

    每个查询词读 :func:`raglib.bm25.allot_postings` 分给它的条数：内联在词典里的整条读；倒排块按块号（影响力从高到低）
    读够为止，各段按它在这个词的 df 里所占的比例分摊。前缀词（孤立的单字，``'肝':*``）是一段词位：同一分块里
    命中的各词位先把词频相加再饱和，与 tsquery 的前缀匹配一致。非 plain 查询（短语、布尔、exact）另外要求分块
    满足 tsquery。
    """
    params = _bm25_params()
    # 合并完的库（上一个查询看到 L0 与删除集都空）：不开事务、不读统计行，回表的语句顺带核对（一次往返）
    settled = DICTIONARIES.settled(kb_id) if scope.documents is not None and query.type == "plain" else None
    if settled is not None:
        with search_connection().cursor() as cursor:
            found = _ranked(cursor, kb_id, query, scope, limit, params, settled)
        if found is not None:
            return found
        DICTIONARIES.remember_settled(kb_id, None)
    with _snapshot_cursor() as cursor:
        found = _ranked(cursor, kb_id, query, scope, limit, params, None)
    assert found is not None  # 不带 settled 时总有结果
    return found


def _ranked(cursor: Any, kb_id: uuid.UUID, query: ParsedQuery, scope: ChunkScope, limit: int, params: Bm25Params,
            settled: SettledState | None) -> tuple[list[PathHit], Bm25Statistics] | None:
    """:func:`_bm25_search` 在 ``cursor`` 上的一遍。``settled`` 给出时统计取自它、不在一个快照里：段的块不变，
    读到的都还是那些段的；回表的语句核对统计行、L0、删除集与段表仍是它，不是就返回 None（调用方忘掉它、
    在快照里重查）。没有可读的查询词而提前结束时，单独一条语句核对。"""
    snapshot = _read_snapshot(cursor, kb_id, query.terms, settled)
    statistics = snapshot.statistics
    reads = allot_postings(score_terms(query.terms, statistics.dfs, statistics.n, params),
                           settings.BM25_MAX_POSTINGS)
    if not reads or _lacks_required(query, statistics):
        # 没有一个查询词出现在这个知识库里，或者必需的词有一个不在（按记下的统计时先核对它还成立）
        if settled is not None and not fetchall_prepared(cursor.db, f"SELECT {_SETTLED_CHECK}",
                                                         _settled_args(kb_id, settled))[0][0]:
            return None
        return [], statistics
    # 额度里要读倒排的前缀词，现在才取它们的条目（常见字的前缀词读不起，额度分配时已经跳过）
    prefixed = DICTIONARIES.prefix_entries(cursor, kb_id, snapshot.segments,
                                           [r.scored.term.lexeme for r in reads if r.scored.term.prefix])
    # 倒排按查询词的位置（slot）标号：同一词位既是精确词又落在某个前缀词里时各算各的，前缀词的各词位共用一个号
    # （打分时同一分块在一个位上的词频先相加再饱和）
    pairs: list[tuple[int, bytes]] = []
    joined: list[tuple[bytes, np.ndarray, int]] = []  # 前缀词在各段里拼好的内联倒排：(数据, 各条的字节数, 位)
    wanted: list[tuple[int, str, int, int]] = []  # (段号, 词位, 读几块, 位)
    l0_parts: list[tuple[int, int, int, int, int]] = []  # (位, 分块 id, 词数, 标题词频, 正文词频)
    for slot, read in enumerate(reads):
        key = (read.scored.term.lexeme, read.scored.term.prefix)
        if key[1]:
            for segment_id, found in prefixed.get(key[0], []):
                joined.append((found.joined, found.lengths, slot))
                wanted += [(segment_id, entry.lexeme, _blocks_to_read(read, entry), slot) for entry in found.blocked]
        else:
            for segment_id, entry in snapshot.entries.get(key, []):
                if entry.inline is not None:
                    pairs.append((slot, entry.inline))
                else:
                    wanted.append((segment_id, entry.lexeme, _blocks_to_read(read, entry), slot))
        for _, rows in _l0_rows(snapshot.l0, key):
            l0_parts += [(slot, chunk_id, length, title, body) for chunk_id, length, title, body in rows]
    # 倒排块是一次查询里传得最多的数据：常见词的前几块多半在进程的段缓存里，缺的按二进制格式取（同一个快照；
    # 带 settled 时是自动提交的一条语句，段不变，读到的还是那个段的块）
    blocks = DICTIONARIES.posting_blocks(cursor, kb_id, snapshot.segments, wanted)
    # 新写的块不带长度字节：按序号从段里查（缓存在进程里，见 search.segment_cache）
    try:
        norms = DICTIONARIES.norms(cursor, kb_id, snapshot.segments) if pairs or joined or blocks else None
    except StaleSegments:
        if settled is None:  # 快照里的段表不会缺段
            raise
        return None  # 记下的段表过时了：调用方在快照里重查
    postings = _decode(pairs, joined, blocks, norms).without_docs(snapshot.deleted)
    # L0 的分块还没有序号：用负数作它们的键（-1 - 下标），与段里的序号不冲突
    l0_chunks = sorted({part[1] for part in l0_parts})
    l0_key = {chunk_id: -1 - i for i, chunk_id in enumerate(l0_chunks)}
    if l0_parts:
        postings = Postings.concat([postings, Postings(
            np.array([p[0] for p in l0_parts], dtype=np.int32),
            np.array([l0_key[p[1]] for p in l0_parts], dtype=np.int64),
            np.array([capped_tf(p[3]) for p in l0_parts], dtype=np.uint8),
            np.array([capped_tf(p[4]) for p in l0_parts], dtype=np.uint8),
            norm_bytes(np.array([p[2] for p in l0_parts], dtype=np.int64)))])
    postings = _trim(postings, reads)
    docs, scores = bm25_scores(postings, None, [r.scored.weight for r in reads], k1=params.k1, b=params.b,
                               avgdl=statistics.avgdl, title_weight=params.title_weight)
    docs, scores = _with_required(query, reads, postings, docs, scores)
    hits = _in_scope(cursor, kb_id, query, scope, docs, scores, l0_chunks, limit, settled)
    return None if hits is None else (hits, statistics)


def _decode(pairs: Sequence[tuple[int, bytes]], joined: Sequence[tuple[bytes, np.ndarray, int]],
            blocks: Sequence[tuple[int, bytes]], norms: NormLookup | None) -> Postings:
    """精确词的内联倒排、前缀词在各段里拼好的内联倒排、倒排块，按这个顺序一次解码（每次调用 numpy 有十几次的固定
    开销）。同一个位里先内联、后块，与逐块排好再解码时相同：同一分块在前缀词的位上的几条倒排按这个先后相加。"""
    if not joined:  # 多数查询没有要读的前缀词
        return decode_blocks([*pairs, *blocks], norms) if pairs or blocks else Postings.empty()
    lengths = np.concatenate([np.fromiter((len(data) for _, data in pairs), dtype=np.int64, count=len(pairs)),
                              *(part[1] for part in joined),
                              np.fromiter((len(data) for _, data in blocks), dtype=np.int64, count=len(blocks))])
    slots = np.concatenate([np.fromiter((slot for slot, _ in pairs), dtype=np.int32, count=len(pairs)),
                            np.repeat(np.array([part[2] for part in joined], dtype=np.int32),
                                      [len(part[1]) for part in joined]),
                            np.fromiter((slot for slot, _ in blocks), dtype=np.int32, count=len(blocks))])
    data = b"".join([*(data for _, data in pairs), *(part[0] for part in joined), *(data for _, data in blocks)])
    return decode_joined(data, lengths, slots, norms)


def _blocks_to_read(read: TermRead, entry: Entry) -> int:
    """一个词在一个段里读前几块：截断读的词按这个段在它 df 里所占的比例分摊读取额度。"""
    share = read.rows if not read.truncated else read.rows * entry.df / max(read.scored.df, 1)
    return min(entry.blocks, math.ceil(share / BLOCK_SIZE))


def _lacks_required(query: ParsedQuery, statistics: Bm25Statistics) -> bool:
    """必需的词（:attr:`ParsedQuery.required`）有一个在知识库里 df 为 0：没有分块满足 tsquery。

    只看也是查询词（``query.terms``，读了 df）的那些：查询词有个数上限，超出的必需词没有 df 可看，不作判断。
    """
    scored = {(term.lexeme, term.prefix) for term in query.terms}
    return any(key in scored and statistics.dfs.get(key, 0) <= 0 for key in query.required)


def _with_required(query: ParsedQuery, reads: Sequence[TermRead], postings: Postings, docs: np.ndarray,
                   scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """短语、布尔、exact 查询：去掉缺少某个必需词的候选，只留可能满足 tsquery 的去回表检查。

    只用整条读到了倒排的必需词（``rows == df``：稀有词、读得起的前缀词）：候选不在它的倒排里，就确实不含这个词，
    回表时也过不了 tsquery，去掉它不改变结果。截断读的常见词不作判断。候选按分数排好的顺序不变。回表检查
    每个候选都要取出分块的词位（解压、转回 tsvector，每个几十微秒），短语不在库里时以前要把几千个候选逐个查完。
    """
    if not query.required or not len(docs):
        return docs, scores
    slots = {(read.scored.term.lexeme, read.scored.term.prefix): slot
             for slot, read in enumerate(reads) if not read.truncated}
    keep = np.ones(len(docs), dtype=bool)
    for key in query.required:
        slot = slots.get(key)
        if slot is not None:
            keep &= np.isin(docs, postings.docs[postings.terms == slot])
    return docs[keep], scores[keep]


def _trim(postings: Postings, reads: Sequence[TermRead]) -> Postings:
    """截断读取的词只留影响力最高的 ``rows`` 条（同影响力按序号）：各段按比例多读的那一点、内联在词典里的整条，
    都在这里按额度收回，读到的工作量与 v1 的“按影响力读前 rows 行”相同。``postings.terms`` 是查询词的位。

    每个要截的位：键是 (影响力降序, 序号)，用 ``np.partition`` 在线性时间里找出第 ``rows`` 小的键，只留不大于它的。
    要截的多半只是最后一块里的几十条，全部两万条排序是白排（整个截断 0.19 → 0.13 ms，bench/pages/fulltext_engine.md）。
    截断读取的都是精确词，同一个分块在一个位上只有一条倒排，键各不相同；万一有相同的键（同一分块的几条），
    按稳定排序保持读入的先后取前 ``rows`` 个。
    """
    if not len(postings):
        return postings
    counts = np.bincount(postings.terms, minlength=len(reads))
    limits = np.array([read.rows if read.truncated else len(postings) for read in reads], dtype=np.int64)
    over = np.flatnonzero(counts > limits)
    if not over.size:
        return postings
    keep = np.ones(len(postings), dtype=bool)
    for slot in over.tolist():
        members = np.flatnonzero(postings.terms == slot)
        limit = int(limits[slot])
        if limit == 0:
            keep[members] = False
            continue
        # (影响力降序, 序号) 拼成一个键：影响力不到 2^15，序号减去最小值（L0 的键是负数）后不到 2^32
        docs = postings.docs[members] - postings.docs[members].min()
        strength = impacts(postings.title_tf[members], postings.body_tf[members], postings.norms[members])
        key = ((32767 - strength.astype(np.int64)) << max(1, int(docs.max()).bit_length())) | docs
        kept = key <= np.partition(key, limit - 1)[limit - 1]
        if np.count_nonzero(kept) > limit:
            kept[:] = False
            kept[np.argsort(key, kind="stable")[:limit]] = True
        keep[members[~kept]] = False
    return postings.select(keep)


# 回表检查范围的第一批：有过滤条件（或短语、布尔、exact 查询）时是 limit 的这么多倍、至少 _BM25_FIRST_MIN 个，
# 否则就是 limit 个；第二批 _BM25_SHORTLIST 个，再不够才检查其余的
_BM25_FIRST_BATCH = 3
_BM25_FIRST_MIN = 30
_BM25_SHORTLIST = 400


def _array_literal(values: Iterable[Any]) -> str:
    """数字数组的 PostgreSQL 字面量（``{1,NULL,3}``），SQL 里再转成 int[]/bigint[]/float8[]。

    Django 的 psycopg 后端在客户端把参数拼进 SQL：几百个元素的列表逐个适配、加引号，一次检索要花几毫秒；
    一个字符串只适配一次。只用于数字与 NULL（``repr`` 给出 float 的完整精度），不含需要转义的字符。
    """
    return "{" + ",".join(str(value) for value in values) + "}"


def _batches(docs: np.ndarray, scores: np.ndarray, limit: int, first: int) -> Iterator[np.ndarray]:
    """候选按（分数降序, 键升序）分批给出下标：先 ``first`` 个，再到 ``max(limit * 4, _BM25_SHORTLIST)`` 个，
    再其余的；每批延到同分段的末尾，同分的候选不拆开。

    第一批用 ``np.partition`` 在线性时间里挑出来，只给这几十个排序：常见词的查询有上万个候选，给全部候选排序
    （2 万个约 2 ms）只在第一批不够时才做。
    """
    negated = -scores
    if first < len(scores):
        # 分数不低于第 first 名的全部候选（含与它同分的）：正是完整排序的一个前缀
        head = np.flatnonzero(negated <= np.partition(negated, first - 1)[first - 1])
    else:
        head = np.arange(len(scores))
    yield head[np.lexsort((docs[head], negated[head]))]
    if len(head) == len(scores):
        return
    order = np.lexsort((docs, negated))
    ranked = negated[order]  # 升序：二分找同分段的末尾
    start = len(head)
    for size in (max(limit * 4, _BM25_SHORTLIST), len(order)):
        end = min(size, len(order))
        if end > start:
            end = int(np.searchsorted(ranked, ranked[end - 1], side="right"))
            yield order[start:end]
            start = end


# 合并完的状态（SettledState）仍然成立：统计行未变，L0 与删除集都空，段表（段号、代号）未变
_SETTLED_CHECK = (
    "EXISTS (SELECT 1 FROM fulltext_kb_stats s WHERE s.knowledge_base_id = %s::uuid AND s.chunk_count = %s::bigint"
    " AND s.total_length = %s::bigint)"
    " AND NOT EXISTS (SELECT 1 FROM fulltext_l0 l WHERE l.knowledge_base_id = %s::uuid)"
    " AND NOT EXISTS (SELECT 1 FROM fulltext_deleted d WHERE d.knowledge_base_id = %s::uuid)"
    " AND (SELECT coalesce(array_agg(ARRAY[g.segment_id::bigint, g.generation] ORDER BY g.segment_id), '{}')"
    " FROM fulltext_segments g WHERE g.knowledge_base_id = %s::uuid) = %s::bigint[]")


def _settled_args(kb_id: uuid.UUID, settled: SettledState) -> list[Any]:
    """``_SETTLED_CHECK`` 的参数。"""
    return [kb_id, settled.chunk_count, settled.total_length, kb_id, kb_id, kb_id,
            "{" + ",".join(f"{{{segment},{generation}}}" for segment, generation in settled.segments) + "}"]


def _in_scope(cursor: Any, kb_id: uuid.UUID, query: ParsedQuery, scope: ChunkScope, docs: np.ndarray,
              scores: np.ndarray, l0_chunks: Sequence[int], limit: int,
              settled: SettledState | None = None) -> list[PathHit] | None:
    """候选（段里的序号或 L0 的负键）按分数从高到低换成分块 id、回表检查范围，取前 ``limit`` 个。

    由小到大分批检查分数最高的候选：长问题会命中上千个分块，逐个换 id、回表占全文一路一半的时间，而没有过滤条件时
    前 limit 个几乎总在范围内；范围内的结果不够 limit 时才检查下一批（几百个），再不够才检查其余的——结果与一次
    做完全相同。同分按分块 id 升序：同分的候选不拆到两批里（拆开就可能把 id 更小的那个留到下一批）。

    ``settled``（只在只看文档的普通查询上给出）：分数是按它、不在一个快照里算的，每一批的语句同时核对它，
    在那条语句的快照里它成立，序号 → 分块与文档状态就是这个状态下的；不成立时返回 None。
    """
    hits: list[PathHit] = []
    # 没有过滤条件的普通查询只看分块所属的文档（ChunkScope.documents）；其余的要看分块行
    documents = scope.documents if query.type == "plain" else None
    # 要看分块行时范围会筛掉不少候选，第一批多取；只看文档时筛掉的只有非 completed 文档的分块，
    # 取够 limit 个几乎总是一批就完
    first = limit if documents is not None else max(limit * _BM25_FIRST_BATCH, _BM25_FIRST_MIN)
    if documents is None:
        # 元数据过滤、tsquery、exact 的原文包含：逐个候选按主键回表（OFFSET 0 阻止展平：展平成连接时规划器低估候选数，
        # 曾把整个知识库的分块读出来做哈希连接，100k 分块时 125 ms，逐个回表 400 个只要几毫秒）
        # 短语、布尔查询是否满足 tsquery 不在这条 SQL 里查（分块不存 tsvector），取回范围内的候选后按分数顺序
        # 检查（_satisfying：只看词在不在的用引擎的正排，短语对原文重新切词）
        match, params = _match_sql(query, scope)
        check = (f"CROSS JOIN LATERAL (SELECT c.id FROM document_chunks c WHERE c.id = k.chunk_id AND {match}"
                 " OFFSET 0) c")
    else:
        # 范围只是“completed 文档里的可检索分块”：L0 与序号表记着每个分块的文档，只查文档表，不读分块行
        # （冷缓存时每个候选少两次随机读，bench/pages/fulltext_scale.md 的“冷缓存与回表”）
        # 按文档主键逐个查（EXISTS），不把库里全部 completed 文档读出来做哈希：一个条目一份文档的库有上万份
        condition, params = documents
        check = ("CROSS JOIN LATERAL (SELECT k.chunk_id AS id WHERE EXISTS (SELECT 1 FROM documents d"
                 f" WHERE d.id = k.document_id AND {condition})) c")
    for batch in _batches(docs, scores, limit, first):
        keys = docs[batch].tolist()
        # 段里的候选给序号、L0 的给分块 id，在同一条语句里换成分块 id 与文档（少一次往返）；序号在这个快照里不在
        # fulltext_docs 的（不会出现：删除集已经滤掉）连不上分块，自然落选。同分按分块 id 升序
        sql = ("SELECT c.id, t.score FROM unnest(%s::int[], %s::bigint[], %s::float8[]) AS t(ordinal, chunk, score)"
               " CROSS JOIN LATERAL (SELECT d.chunk_id, d.document_id FROM fulltext_docs d"
               " WHERE d.knowledge_base_id = %s::uuid AND d.ordinal = t.ordinal UNION ALL SELECT l.chunk_id,"
               " l.document_id FROM fulltext_l0 l WHERE l.knowledge_base_id = %s::uuid AND l.chunk_id = t.chunk) k"
               f" {check} ORDER BY t.score DESC, c.id LIMIT %s::int")
        args = [_array_literal(key if key >= 0 else "NULL" for key in keys),
                _array_literal(l0_chunks[-1 - key] if key < 0 else "NULL" for key in keys),
                _array_literal(repr(float(score)) for score in scores[batch].tolist()), kb_id, kb_id,
                *params, limit - len(hits) if query.type == "plain" else len(keys)]
        if settled is not None:
            rows = fetchall_prepared(
                cursor.db, f"SELECT v.ok, r.id, r.score FROM (SELECT {_SETTLED_CHECK} AS ok) v"
                f" LEFT JOIN LATERAL ({sql}) r ON v.ok ORDER BY r.score DESC, r.id",
                [*_settled_args(kb_id, settled), *args])
            if not rows[0][0]:
                return None
            found = [(chunk_id, score) for _, chunk_id, score in rows if chunk_id is not None]
        elif documents is not None:
            # 普通查询（最常见的那种）：SQL 只随范围的写法变，预备语句
            found = fetchall_prepared(cursor.db, sql, args)
        else:
            # 过滤条件的参数类型各式各样（列表、JSON、日期），交给 Django 的游标在客户端适配
            cursor.execute(sql, args)
            found = cursor.fetchall()
            if query.type != "plain":
                found = _satisfying(cursor, kb_id, query.tsquery, found, limit - len(hits))
        hits += [PathHit(int(chunk_id), float(score)) for chunk_id, score in found]
        if len(hits) >= limit:
            break
    return hits


def _satisfying(cursor: Any, kb_id: uuid.UUID, tsquery: str, found: Sequence[tuple[Any, Any]],
                need: int) -> list[tuple[Any, Any]]:
    """按分数顺序排好的候选（分块 id, 分数）里满足 tsquery 的前 ``need`` 个。

    分块不存 tsvector（:func:`_matching`：短语要对原文重新切词，每块 0.2~0.6 ms）：一次只查 ``need`` 个（至少
    ``_MATCH_STEP_MIN`` 个），不够再查下一组，够数就停。候选已按必需词筛过（:func:`_with_required`），
    排在前面的多半都满足。
    """
    kept: list[tuple[Any, Any]] = []
    start, step = 0, max(need, _MATCH_STEP_MIN)
    while start < len(found) and len(kept) < need:
        group = found[start:start + step]
        satisfied = _matching(cursor, kb_id, [int(chunk_id) for chunk_id, _ in group], tsquery)
        kept += [row for row in group if int(row[0]) in satisfied]
        start += step
    return kept[:need]


# 短语、布尔、exact 查询回表时一次至少检查这么多个候选（_matching）
_MATCH_STEP_MIN = 10


# ---------------------------------------------------------------- 引擎


class PostgresFulltextEngine:
    """:class:`search.fulltext.FulltextEngine` 的 PostgreSQL 实现：段 + L0 的压缩块倒排上的 BM25（默认），
    或 ``@@`` 匹配、``ts_rank_cd`` 排序（``RAG_FULLTEXT_RANKING=ts_rank_cd``，逐块匹配，只适合小库与对照）。

    分块写入不经过引擎：触发器把新分块追加进 L0（SQL 在 ``search/sql/``），后台任务把 L0 合并成段
    （:mod:`search.segments`）。
    """

    def search(self, kb_id: uuid.UUID, query: ParsedQuery, scope: ChunkScope, limit: int) -> FulltextHits:
        """exact 查询除了词序匹配，还要求原文（不区分大小写）逐字包含引号里的内容。"""
        if not query.tsquery:
            return FulltextHits([], 0.0)
        if settings.FULLTEXT_RANKING == "ts_rank_cd":
            statistics = self.statistics(kb_id, query.terms)
            return FulltextHits(_ts_rank_cd_search(kb_id, query, scope, limit),
                                coverage(query.terms, statistics.dfs, statistics.n))
        hits, statistics = _bm25_search(kb_id, query, scope, limit)
        cover = coverage(query.terms, statistics.dfs, statistics.n)
        scale = max_score(query.terms, statistics.dfs, statistics.n, settings.BM25_K1)
        return FulltextHits(hits, cover, scale, statistics)

    def scores(self, kb_id: uuid.UUID, query: ParsedQuery, chunk_ids: Sequence[int],
               statistics: Bm25Statistics) -> dict[int, float]:
        return chunk_scores(kb_id, query, chunk_ids, statistics)

    def matching(self, kb_id: uuid.UUID, chunk_ids: Sequence[int], tsquery: str) -> set[int]:
        with search_connection().cursor() as cursor:
            return _matching(cursor, kb_id, chunk_ids, tsquery)

    def statistics(self, kb_id: uuid.UUID, terms: Sequence[QueryTerm]) -> Bm25Statistics:
        return load_statistics(kb_id, terms)

    def index(self, *, kb_id: uuid.UUID | None = None) -> int:
        return reindex_chunks(kb_id=kb_id)

    def compact(self, kb_id: uuid.UUID) -> int:
        return segments.compact(kb_id).chunks

    def delete(self, kb_id: uuid.UUID) -> int:
        return segments.drop(kb_id)

    def rebuild(self, kb_id: uuid.UUID) -> None:
        segments.rebuild(kb_id)

    def verify(self, kb_id: uuid.UUID) -> list[str]:
        return segments.mismatches(kb_id)
