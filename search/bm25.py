"""PostgreSQL 里的 BM25：全文引擎的 PostgreSQL 实现（:class:`PostgresFulltextEngine`），以及它的统计与倒排表的
读取、打分、核对与重建。接口与 SQL 文件的布局见 :mod:`search.fulltext`，打分公式与纯函数见 :mod:`raglib.bm25`。

- ``tf_t``：词 t 在分块里的加权次数：正文出现一次记 1，标题部分（文件名、文档标题、标题路径）记
  ``RAG_BM25_TITLE_WEIGHT``；倒排表 ``fulltext_postings`` 分别存标题与正文的次数，权重在查询时才乘，改权重不用重建；
- ``dl``：分块的词数（``document_chunks.search_length``，倒排表里冗余一份）；``N``、``avgdl``、``df_t``：
  ``fulltext_kb_stats`` 与 ``fulltext_term_stats``。三张表都由触发器在让分块可见/消失的同一事务里维护
  （``search/sql/fulltext_stats_maintain.v1.sql``），永远与分块一致。

工作量有界：一个查询最多读 ``RAG_BM25_MAX_POSTINGS`` 行倒排，由 :func:`raglib.bm25.allot_postings`
分给各个查询词——稀有词整条读完，常见词平分剩下的额度。倒排表里同一词位的行按影响力（词频饱和项，
``search/sql/fulltext_impact.v1.sql``）从高到低存放，常见词只读贡献最大的那一段：1M 分块的知识库里一个常见 bigram
有几十万行，读前几千行就够排出前几名，被截掉的行对分数的贡献既小（IDF 低）又是同一词里最小的。
各词的 df 之和不超过额度时（小知识库、具体的问题）结果与全量打分完全相同。

``statistics_drop``、``rebuild_statistics``、``statistics_mismatches`` 也是模块级函数：整库清理（``ops.cleanup``）
与基准脚本直接调用它们；引擎的 ``delete``、``rebuild``、``verify`` 就是它们。
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from infra.routers import search_connection
from raglib.analysis import ParsedQuery, QueryTerm, chunk_titles, document_terms
from raglib.bm25 import Bm25Params, allot_postings, chunk_score, coverage, max_score, score_terms
from search.fulltext import Bm25Statistics, ChunkScope, FulltextHits, PathHit

# 只统计可检索的分块；与触发器里的条件一致
_SEARCHABLE = "role <> 'parent'"


# ---------------------------------------------------------------- 统计：读取、重算、核对


def load_statistics(kb_id: uuid.UUID, terms: Sequence[QueryTerm]) -> Bm25Statistics:
    """知识库的分块数 N、平均词数 avgdl 与各查询词的 df（键为 (词位, 前缀?)）。

    前缀词的“df”是以它开头的各词位 df 之和，也就是那一段倒排的行数（读它要花的工作量）；它可能超过 N，
    算 IDF 时由 :func:`raglib.bm25.idf` 截到 N。
    """
    exact = [t.lexeme for t in terms if not t.prefix]
    prefixes = [t.lexeme for t in terms if t.prefix]
    with search_connection().cursor() as cursor:
        # 知识库统计与精确词的 df 一条查询读出（检索的每个请求都走这里，少一次数据库往返）
        cursor.execute("SELECT s.chunk_count, s.total_length, t.lexeme, t.df FROM fulltext_kb_stats s"
                       " LEFT JOIN fulltext_term_stats t ON t.knowledge_base_id = s.knowledge_base_id"
                       " AND t.lexeme = ANY(%s::text[]) WHERE s.knowledge_base_id = %s", [exact, kb_id])
        rows = cursor.fetchall()
        n, total = (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)
        dfs: dict[tuple[str, bool], int] = {}
        if n <= 0:
            return Bm25Statistics(0, 0.0, dfs)
        dfs.update(((lexeme, False), int(df)) for _, _, lexeme, df in rows if lexeme is not None)
        for prefix in prefixes:
            # 主键是 (知识库, 词位 COLLATE "C")：前缀就是一段连续的主键范围。前缀词单独一条查询：并进上面那条时
            # 规划器只能按参数做通用计划（位图扫描），1M 分块的库里常见单字要慢一倍
            cursor.execute("SELECT coalesce(sum(df), 0) FROM fulltext_term_stats WHERE knowledge_base_id = %s"
                           " AND lexeme >= %s AND lexeme < %s", [kb_id, prefix, prefix + "\U0010ffff"])
            dfs[(prefix, True)] = int(cursor.fetchone()[0])
    return Bm25Statistics(n, total / n, dfs)


_RECOUNT_KB_SQL = f"""
    SELECT %s::uuid, count(*), coalesce(sum(search_length), 0)
    FROM document_chunks WHERE knowledge_base_id = %s AND {_SEARCHABLE}
"""
_RECOUNT_TERMS_SQL = f"""
    SELECT %s::uuid, lexeme, count(*)
    FROM document_chunks, unnest(tsvector_to_array(search_vector)) AS lexeme
    WHERE knowledge_base_id = %s AND {_SEARCHABLE}
    GROUP BY lexeme
"""


# 与触发器（search/sql/fulltext_stats_apply.v1.sql）写入的行一致：影响力由同一个 SQL 函数算出。
# 这里刻意另写一遍而不调用触发器的函数：核对（statistics_mismatches）要的是一份独立的重算
_RECOUNT_POSTINGS_SQL = f"""
    SELECT g.kb, g.lexeme, fulltext_impact(g.title_tf, g.body_tf, g.len), g.chunk, g.title_tf, g.body_tf, g.len
    FROM (SELECT %s::uuid AS kb, u.lexeme, c.id AS chunk, c.search_length AS len,
                 coalesce(cardinality(array_positions(u.weights, 'A')), 0) AS title_tf,
                 coalesce(cardinality(u.weights) - cardinality(array_positions(u.weights, 'A')), 0) AS body_tf
          FROM document_chunks c, unnest(c.search_vector) u
          WHERE c.knowledge_base_id = %s AND c.{_SEARCHABLE}) g
"""
_POSTING_COLUMNS = "knowledge_base_id, lexeme, impact, chunk_id, title_tf, body_tf, length"


def rebuild_statistics(kb_id: uuid.UUID) -> None:
    """按分块重算一个知识库的统计与倒排表（锁住统计行，与并发写入的触发器互斥）。修复与测试使用。"""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO fulltext_kb_stats (knowledge_base_id, chunk_count, total_length)"
                       " VALUES (%s, 0, 0) ON CONFLICT DO NOTHING", [kb_id])
        cursor.execute("SELECT 1 FROM fulltext_kb_stats WHERE knowledge_base_id = %s FOR UPDATE", [kb_id])
        cursor.execute("DELETE FROM fulltext_postings WHERE knowledge_base_id = %s", [kb_id])
        cursor.execute(f"INSERT INTO fulltext_postings ({_POSTING_COLUMNS}) {_RECOUNT_POSTINGS_SQL}", [kb_id, kb_id])
        cursor.execute("DELETE FROM fulltext_term_stats WHERE knowledge_base_id = %s", [kb_id])
        cursor.execute("INSERT INTO fulltext_term_stats (knowledge_base_id, lexeme, df) " + _RECOUNT_TERMS_SQL,
                       [kb_id, kb_id])
        cursor.execute("UPDATE fulltext_kb_stats s SET chunk_count = r.n, total_length = r.len"
                       f" FROM ({_RECOUNT_KB_SQL}) AS r(kb, n, len) WHERE s.knowledge_base_id = r.kb",
                       [kb_id, kb_id])


def statistics_drop(kb_id: uuid.UUID, *, batch_lexemes: int = 2000) -> int:
    """整库清理的快路：按词位分段删掉知识库的倒排，再删掉它的统计行；返回删掉的倒排行数。

    统计行不在时触发器对这个知识库什么也不做（``search/sql/fulltext_stats_apply.v1.sql``），之后逐批删分块不再
    逐行维护倒排：以前删 1,000 个分块要约 8 s，1M 分块的库要按小时计。倒排每次删 ``batch_lexemes`` 个词位
    （主键的一段范围）并提交，一条语句不会删上亿行；最后锁住统计行再删（正在提交的摄取先做完），统计行上的触发器
    （``fulltext_kb_stats_dropped``）顺带删掉这期间新写入的倒排。
    删完之后才写入的分块会重新建起统计行，所以清理结束时要再调一次。
    """
    # 分段的边界取自词统计（每个词位一行），不从倒排里 DISTINCT：常见词一个就有上百万行倒排
    deleted, last = 0, ""
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                # 词统计的 lexeme 与倒排一样是 COLLATE "C"：两张表的范围边界按同一顺序比较
                "SELECT max(lexeme) FROM (SELECT lexeme FROM fulltext_term_stats"
                " WHERE knowledge_base_id = %s AND lexeme > %s ORDER BY lexeme LIMIT %s) batch",
                [kb_id, last, batch_lexemes],
            )
            (upper,) = cursor.fetchone()
            if upper is None:
                break
            cursor.execute("DELETE FROM fulltext_postings WHERE knowledge_base_id = %s AND lexeme > %s"
                           " AND lexeme <= %s", [kb_id, last, upper])
            deleted += cursor.rowcount
            last = upper
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM fulltext_kb_stats WHERE knowledge_base_id = %s FOR UPDATE", [kb_id])
        cursor.execute("DELETE FROM fulltext_term_stats WHERE knowledge_base_id = %s", [kb_id])
        cursor.execute("DELETE FROM fulltext_kb_stats WHERE knowledge_base_id = %s", [kb_id])
    return deleted


def statistics_mismatches(kb_id: uuid.UUID) -> list[str]:
    """存储的统计与按分块重算的差异（人能读的描述）；空列表表示完全一致。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT chunk_count, total_length FROM fulltext_kb_stats WHERE knowledge_base_id = %s",
                       [kb_id])
        stored_kb = cursor.fetchone() or (0, 0)
        cursor.execute(_RECOUNT_KB_SQL, [kb_id, kb_id])
        counted_kb = cursor.fetchone()[1:]
        cursor.execute("SELECT lexeme, df FROM fulltext_term_stats WHERE knowledge_base_id = %s", [kb_id])
        stored = {lexeme: int(df) for lexeme, df in cursor.fetchall()}
        cursor.execute(_RECOUNT_TERMS_SQL, [kb_id, kb_id])
        counted = {lexeme: int(df) for _, lexeme, df in cursor.fetchall()}
        cursor.execute(f"SELECT {_POSTING_COLUMNS} FROM fulltext_postings WHERE knowledge_base_id = %s", [kb_id])
        stored_postings = {tuple(row) for row in cursor.fetchall()}
        cursor.execute(_RECOUNT_POSTINGS_SQL, [kb_id, kb_id])
        counted_postings = {tuple(row) for row in cursor.fetchall()}
    problems = [f"posting {row[1:]!r} stored but not counted" for row in sorted(stored_postings - counted_postings)]
    problems += [f"posting {row[1:]!r} counted but not stored" for row in sorted(counted_postings - stored_postings)]
    if tuple(map(int, stored_kb)) != tuple(map(int, counted_kb)):
        problems.append(f"chunks/length stored {tuple(stored_kb)} != counted {tuple(counted_kb)}")
    for lexeme in sorted(set(stored) | set(counted)):
        if stored.get(lexeme, 0) != counted.get(lexeme, 0):
            problems.append(f"df({lexeme!r}) stored {stored.get(lexeme)} != counted {counted.get(lexeme)}")
    return problems


# ---------------------------------------------------------------- 全文列的重算（引擎的 index）

# 按 id 翻页读分块；{scope} 是可选的知识库条件
_CHUNK_PAGE_SQL = ("SELECT c.id, c.chunk_text, c.metadata::text FROM document_chunks c"
                   " WHERE c.id > %s {scope} ORDER BY c.id LIMIT %s")
# 一批分块的新全文列一条 UPDATE 写回；触发器在同一事务里把统计与倒排换成新的
_WRITE_TERMS_SQL = ("UPDATE document_chunks AS c SET search_vector = v.sv::tsvector, search_length = v.len"
                    " FROM unnest(%s::bigint[], %s::text[], %s::int[]) AS v(id, sv, len) WHERE c.id = v.id")


def _chunk_terms(text: str, metadata: str | None) -> tuple[str, int]:
    """一个分块的 tsvector 字面量与词数：与摄取（``documents.ingestion.build_rows``）同一个切法与标题规则。"""
    meta = json.loads(metadata) if metadata else {}
    meta = meta if isinstance(meta, dict) else {}
    titles = chunk_titles(meta.get("filename") or "", meta.get("title"), meta.get("heading_path") or ())
    return document_terms(text, titles, analyzer=settings.FULLTEXT_ANALYZER)


def reindex_chunks(*, kb_id: uuid.UUID | None = None, batch_size: int = 500) -> int:
    """按当前的切词设置（``RAG_FULLTEXT_ANALYZER``）重算分块的 tsvector 与词数（分批 UPDATE）。返回处理的行数。

    不重新解析、不重新向量化；触发器在每批的事务里更新统计与倒排，检索在重算期间照常可用
    （同一知识库里新旧切法的分块会短暂并存，重算完即一致）。
    """
    page_sql = _CHUNK_PAGE_SQL.format(scope="AND c.knowledge_base_id = %s" if kb_id else "")
    scope = [kb_id] if kb_id else []
    last_id, updated = 0, 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(page_sql, [last_id, *scope, batch_size])
            page = cursor.fetchall()
            if not page:
                return updated
            ids = [chunk_id for chunk_id, _, _ in page]
            terms = [_chunk_terms(text, metadata) for _, text, metadata in page]
            cursor.execute(_WRITE_TERMS_SQL, [ids, [vector for vector, _ in terms], [length for _, length in terms]])
        updated += len(page)
        last_id = ids[-1]


# ---------------------------------------------------------------- 检索：BM25 与 ts_rank_cd


def _bm25_params() -> Bm25Params:
    return Bm25Params(settings.BM25_K1, settings.BM25_B, settings.BM25_TITLE_WEIGHT)


def chunk_scores(query: ParsedQuery, chunk_ids: Sequence[int], statistics: Bm25Statistics) -> dict[int, float]:
    """指定分块在这个查询上的完整 BM25 分（不截断倒排），由分块自己的 tsvector 算出；一个查询词都没有的分块为 0。

    全文一路只返回前若干名，混合检索的候选里总有它没列出的分块：给它们补上真实的分数，而不是借用名单里
    别的分块的分数（见 docs/INVARIANTS.md 的 EVIDENCE-OWN）。与倒排表上的打分同一个公式
    （:func:`raglib.bm25.chunk_score`）。
    """
    scores = dict.fromkeys(chunk_ids, 0.0)
    params = _bm25_params()
    terms = score_terms(query.terms, statistics.dfs, statistics.n, params)
    if not terms or not chunk_ids:
        return scores
    exact = [t.term.lexeme for t in terms if not t.term.prefix]
    prefixes = [t.term.lexeme for t in terms if t.term.prefix]
    counts: dict[int, dict[str, tuple[int, int]]] = {}
    lengths: dict[int, int] = {}
    with search_connection().cursor() as cursor:
        # 标题部分的位置权重是 A，正文是 B（见 raglib.analysis），与触发器写倒排时的口径相同
        cursor.execute(
            "SELECT c.id, c.search_length, u.lexeme, coalesce(cardinality(array_positions(u.weights, 'A')), 0),"
            " cardinality(u.weights) FROM document_chunks c, unnest(c.search_vector) u"
            " WHERE c.id = ANY(%s) AND (u.lexeme = ANY(%s::text[])"
            " OR EXISTS (SELECT 1 FROM unnest(%s::text[]) p WHERE starts_with(u.lexeme, p)))",
            [list(chunk_ids), exact, prefixes],
        )
        for chunk_id, length, lexeme, title, total in cursor.fetchall():
            counts.setdefault(int(chunk_id), {})[lexeme] = (int(title), int(total) - int(title))
            lengths[int(chunk_id)] = int(length)
    for chunk_id, chunk_counts in counts.items():
        scores[chunk_id] = chunk_score(terms, chunk_counts, lengths[chunk_id], params, statistics.avgdl)
    return scores


def _match_sql(query: ParsedQuery, scope: ChunkScope) -> tuple[str, list[Any]]:
    """两种排序共用的命中条件（不含 tsquery 本身）：检索范围 + exact 查询的原文包含。"""
    sql, params = scope.sql, list(scope.params)
    if query.type == "exact":
        sql += "".join(" AND strpos(lower(c.chunk_text), lower(%s)) > 0" for _ in query.phrases)
        params += list(query.phrases)
    return sql, params


def _ts_rank_cd_search(query: ParsedQuery, scope: ChunkScope, limit: int) -> list[PathHit]:
    """``ts_rank_cd``（标题 A 权重、正文 B 权重；标志 32 归一到 0~1）：规格点名的排序，没有 IDF 与长度归一。"""
    match, params = _match_sql(query, scope)
    # 命中用 tsquery；排序用 rank_tsquery（phrase 查询里可选的词只抬高排名，不决定是否命中）
    sql = (
        "SELECT c.id, ts_rank_cd(c.search_vector, q.rank_query, 32) AS rank"
        " FROM document_chunks c, (SELECT %s::tsquery AS query, %s::tsquery AS rank_query) q"
        f" WHERE c.search_vector @@ q.query AND {match}"
        " ORDER BY rank DESC, c.id LIMIT %s"
    )
    with search_connection().cursor() as cursor:
        cursor.execute(sql, [query.tsquery, query.rank_tsquery or query.tsquery, *params, limit])
        rows = cursor.fetchall()
    return [PathHit(int(chunk_id), float(rank)) for chunk_id, rank in rows]


def _bm25_search(kb_id: uuid.UUID, query: ParsedQuery, scope: ChunkScope, limit: int,
                 statistics: Bm25Statistics) -> list[PathHit]:
    """BM25：倒排表上按 (分块, 查询词) 汇总加权词频，再按分块求和。

    每个查询词读 :func:`raglib.bm25.allot_postings` 分给它的行数：影响力最高的那一段（倒排主键按影响力排序）。
    前缀词（孤立的单字，``'肝':*``）是一段词位范围，整段读：先把同一查询词在一个分块里命中的各词位的词频相加，
    再做饱和，与 tsquery 的前缀匹配一致。非 plain 查询（短语、布尔、exact）另外要求分块满足 tsquery。
    """
    params = _bm25_params()
    reads = allot_postings(score_terms(query.terms, statistics.dfs, statistics.n, params), settings.BM25_MAX_POSTINGS)
    if not reads:
        return []  # 没有一个查询词出现在这个知识库里
    lows = [r.scored.term.lexeme for r in reads]
    # 精确词：low = high；前缀词：到该前缀下最大的码点为止
    highs = [r.scored.term.lexeme + ("\U0010ffff" if r.scored.term.prefix else "") for r in reads]
    scoring_args: list[Any] = [list(range(len(reads))), lows, highs, [r.scored.weight for r in reads],
                               [r.scored.term.prefix for r in reads], [r.rows for r in reads], params.title_weight,
                               params.k1 * (1 - params.b), params.k1 * params.b / max(statistics.avgdl, 1e-9)]
    # 先只拿分数最高的一批回表检查范围（状态、过滤条件）：长问题会命中上千个分块，逐个回表占全文一路一半的时间。
    # 范围内的结果不够 limit 且确实有分块被这一批截掉时，再对全部候选做一次——结果与一次做完全相同
    shortlist = max(limit * 4, _BM25_SHORTLIST)
    rows = _bm25_rows(kb_id, query, scope, scoring_args, limit, shortlist)
    if len(rows) < limit and (not rows or rows[0][2] > shortlist):
        rows = _bm25_rows(kb_id, query, scope, scoring_args, limit, None)
    return [PathHit(int(chunk_id), float(value)) for chunk_id, value, _ in rows]


_BM25_SHORTLIST = 400


# BM25 的一项：加权词频 tf 的饱和，长度按 avgdl 归一：tf / (tf + k1·(1 - b + b·dl/avgdl))。
# 常数先合并成 k 行的 c0 = k1·(1-b)、c1 = k1·b/avgdl（_bm25_search 里算）：每行倒排少算几次浮点运算
_BM25_SATURATE = "{tf} / ({tf} + k.c0 + k.c1 * {length})"
# 一个查询词读倒排：一次主键范围扫描，只读打分要的几列（仅索引扫描）
_BM25_READ = ("(SELECT chunk_id, k.tw * title_tf + body_tf AS tf, length FROM fulltext_postings"
              " WHERE knowledge_base_id = %s AND {terms}) p")
# 精确词倒着扫（影响力从高到低），读够分到的行数就停；每个分块只有一行，读出来就计分。
# 两支各自读倒排、不经物化的 CTE：1M 行上 2 万行倒排的查询少 10~25% 的时间
_BM25_EXACT_PARTS = (
    f"SELECT p.chunk_id, q.weight * {_BM25_SATURATE.format(tf='p.tf', length='p.length')} AS part"
    " FROM q CROSS JOIN k CROSS JOIN LATERAL "
    + _BM25_READ.format(terms="NOT q.prefix AND lexeme = q.low ORDER BY impact DESC LIMIT q.rows")
)
# 前缀词（一段词位范围）：先把同一分块里命中的各词位的词频相加再饱和，与 tsquery 的前缀匹配一致。
# 通常整段读（分到的行数就是那一段的行数）；只有它读不起、又是唯一能读的词时截在额度上（倒着扫，最多 q.rows 行），
# 一个 1M 分块的库里常见单字的那一段有近百万行
_BM25_PREFIX_PARTS = (
    f"SELECT p.chunk_id, max(q.weight) * {_BM25_SATURATE.format(tf='sum(p.tf)', length='max(p.length)')}"
    " FROM q CROSS JOIN k CROSS JOIN LATERAL "
    + _BM25_READ.format(terms="q.prefix AND lexeme >= q.low AND lexeme <= q.high"
                        " ORDER BY lexeme DESC, impact DESC LIMIT q.rows")
    + " GROUP BY p.chunk_id, q.term, k.c0, k.c1"
)


def _bm25_rows(kb_id: uuid.UUID, query: ParsedQuery, scope: ChunkScope, scoring_args: list[Any],
               limit: int, shortlist: int | None) -> list[tuple[Any, ...]]:
    """(分块 id, BM25 分, 候选数)，范围内按分数降序的前 ``limit`` 个。``shortlist`` 限定回表的候选数：这时只取前
    ``shortlist + 1`` 个候选，候选数大于 ``shortlist`` 就说明有分块被截掉了。"""
    match, match_params = _match_sql(query, scope)
    must = "" if query.type == "plain" else " AND c.search_vector @@ %s::tsquery"
    # 没有前缀词时不带前缀那一支：它的行数估计（整段词位范围）有上亿行，规划器会因此把 2 万行的汇总改成先排序。
    # scoring_args 的第 5 个数组是各查询词是否前缀
    prefix = any(scoring_args[4])
    parts = _BM25_EXACT_PARTS + (f" UNION ALL {_BM25_PREFIX_PARTS}" if prefix else "")
    sql = (
        "WITH q(term, low, high, weight, prefix, rows) AS"
        " (SELECT * FROM unnest(%s::int[], %s::text[], %s::text[], %s::float8[], %s::bool[], %s::int[])),"
        " k(tw, c0, c1) AS (SELECT %s::float8, %s::float8, %s::float8),"
        f" s AS (SELECT chunk_id, sum(part) AS score FROM ({parts}) part GROUP BY chunk_id),"
        # 多取一个候选：取满 shortlist + 1 个就说明有分块被截掉。只数 top 而不数 s，s 只被引用一次，不必物化
        f" top AS (SELECT chunk_id, score FROM s ORDER BY score DESC, chunk_id{' LIMIT %s' if shortlist else ''})"
        # 范围检查逐个候选按主键回表（OFFSET 0 阻止展平）：展平成连接时规划器低估候选数，曾把整个知识库的分块
        # 读出来做哈希连接（100k 分块时 125 ms，逐个回表 400 个只要几毫秒）
        " SELECT c.id, top.score, (SELECT count(*) FROM top) FROM top CROSS JOIN LATERAL"
        f" (SELECT c.id FROM document_chunks c WHERE c.id = top.chunk_id AND {match}{must} OFFSET 0) c"
        " ORDER BY top.score DESC, c.id LIMIT %s"
    )
    args = [*scoring_args, kb_id, *([kb_id] if prefix else []), *([shortlist + 1] if shortlist else []),
            *match_params, *([query.tsquery] if must else []), limit]
    with search_connection().cursor() as cursor:
        cursor.execute(sql, args)
        return list(cursor.fetchall())


# ---------------------------------------------------------------- 引擎


class PostgresFulltextEngine:
    """:class:`search.fulltext.FulltextEngine` 的 PostgreSQL 实现：GIN 索引上的 ``@@`` 匹配，
    按 ``RAG_FULLTEXT_RANKING``（默认 BM25，倒排表上打分；或 ``ts_rank_cd``）排序。

    倒排与统计由 ``document_chunks`` 上的触发器维护（SQL 在 ``search/sql/``）：分块写入不经过引擎。
    """

    def search(self, kb_id: uuid.UUID, query: ParsedQuery, scope: ChunkScope, limit: int) -> FulltextHits:
        """exact 查询除了词序匹配，还要求原文（不区分大小写）逐字包含引号里的内容。"""
        if not query.tsquery:
            return FulltextHits([], 0.0)
        statistics = self.statistics(kb_id, query.terms)
        cover = coverage(query.terms, statistics.dfs, statistics.n)
        if settings.FULLTEXT_RANKING == "ts_rank_cd":
            return FulltextHits(_ts_rank_cd_search(query, scope, limit), cover)
        scale = max_score(query.terms, statistics.dfs, statistics.n, settings.BM25_K1)
        return FulltextHits(_bm25_search(kb_id, query, scope, limit, statistics), cover, scale, statistics)

    def scores(self, query: ParsedQuery, chunk_ids: Sequence[int], statistics: Bm25Statistics) -> dict[int, float]:
        return chunk_scores(query, chunk_ids, statistics)

    def statistics(self, kb_id: uuid.UUID, terms: Sequence[QueryTerm]) -> Bm25Statistics:
        return load_statistics(kb_id, terms)

    def index(self, *, kb_id: uuid.UUID | None = None) -> int:
        return reindex_chunks(kb_id=kb_id)

    def delete(self, kb_id: uuid.UUID) -> int:
        return statistics_drop(kb_id)

    def rebuild(self, kb_id: uuid.UUID) -> None:
        rebuild_statistics(kb_id)

    def verify(self, kb_id: uuid.UUID) -> list[str]:
        return statistics_mismatches(kb_id)
