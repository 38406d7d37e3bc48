"""PostgreSQL 里的 BM25：知识库级统计与倒排表的读取、核对与重建。

打分公式见 :mod:`raglib.bm25`（打分用到的纯函数都在那里）。

- ``tf_t``：词 t 在分块里的加权次数：正文出现一次记 1，标题部分（文件名、文档标题、标题路径）记
  ``RAG_BM25_TITLE_WEIGHT``；倒排表 ``fulltext_postings`` 分别存标题与正文的次数，权重在查询时才乘，改权重不用重建；
- ``dl``：分块的词数（``document_chunks.search_length``，倒排表里冗余一份）；``N``、``avgdl``、``df_t``：
  ``fulltext_kb_stats`` 与 ``fulltext_term_stats``。三张表都由触发器在让分块可见/消失的同一事务里维护
  （见迁移 ``search.0001``），永远与分块一致。

工作量有界：一个查询最多读 ``RAG_BM25_MAX_POSTINGS`` 行倒排，由 :func:`raglib.bm25.allot_postings`
分给各个查询词——稀有词整条读完，常见词平分剩下的额度。倒排表里同一词位的行按影响力（词频饱和项，
见迁移 ``search.0002``）从高到低存放，常见词只读贡献最大的那一段：1M 分块的知识库里一个常见 bigram
有几十万行，读前几千行就够排出前几名，被截掉的行对分数的贡献既小（IDF 低）又是同一词里最小的。
各词的 df 之和不超过额度时（小知识库、具体的问题）结果与全量打分完全相同。
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

from django.conf import settings
from django.db import connection, transaction

from infra.routers import search_connection
from raglib.analysis import QueryTerm, chunk_titles, document_terms

# 只统计可检索的分块；与触发器里的条件一致
_SEARCHABLE = "role <> 'parent'"


# ---------------------------------------------------------------- 统计：读取、重算、核对


def load_statistics(kb_id: uuid.UUID, terms: Sequence[QueryTerm]) -> tuple[int, float, dict[tuple[str, bool], int]]:
    """(分块数 N, 平均词数 avgdl, {(词位, 前缀?): df})。

    前缀词的“df”是以它开头的各词位 df 之和，也就是那一段倒排的行数（读它要花的工作量）；它可能超过 N，
    算 IDF 时由 :func:`idf` 截到 N。
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
            return 0, 0.0, dfs
        dfs.update(((lexeme, False), int(df)) for _, _, lexeme, df in rows if lexeme is not None)
        for prefix in prefixes:
            # 主键是 (知识库, 词位 COLLATE "C")：前缀就是一段连续的主键范围。前缀词单独一条查询：并进上面那条时
            # 规划器只能按参数做通用计划（位图扫描），1M 分块的库里常见单字要慢一倍
            cursor.execute("SELECT coalesce(sum(df), 0) FROM fulltext_term_stats WHERE knowledge_base_id = %s"
                           " AND lexeme >= %s AND lexeme < %s", [kb_id, prefix, prefix + "\U0010ffff"])
            dfs[(prefix, True)] = int(cursor.fetchone()[0])
    return n, total / n, dfs


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


# 与触发器（迁移 search.0002）写入的行一致：影响力由同一个 SQL 函数算出
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

    统计行不在时触发器对这个知识库什么也不做（迁移 ``search.0004``），之后逐批删分块不再逐行维护倒排：以前删
    1,000 个分块要约 8 s，1M 分块的库要按小时计。倒排每次删 ``batch_lexemes`` 个词位（主键的一段范围）并提交，
    一条语句不会删上亿行；最后锁住统计行再删（正在提交的摄取先做完），统计行上的触发器顺带删掉这期间新写入的倒排。
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


def rebuild_search_vectors(*, kb_id: uuid.UUID | None = None, batch_size: int = 500,
                           using_connection: object = None) -> int:
    """按当前的切词设置重算分块的 tsvector 与词数（分批 UPDATE，触发器同步更新统计）。返回处理的行数。

    改了 ``RAG_FULLTEXT_ANALYZER`` 之后由 ``manage.py rebuild_fulltext`` 调用；迁移也用它回填。
    """
    conn = using_connection or connection
    last_id, updated = 0, 0
    scope = "AND knowledge_base_id = %s" if kb_id else ""
    while True:
        with conn.cursor() as cursor:  # type: ignore[attr-defined]
            cursor.execute(
                "SELECT c.id, c.chunk_text, c.metadata::text FROM document_chunks c"
                f" WHERE c.id > %s {scope} ORDER BY c.id LIMIT %s",
                [last_id, *([kb_id] if kb_id else []), batch_size],
            )
            rows = cursor.fetchall()
            if not rows:
                return updated
            ids, vectors, lengths = [], [], []
            for chunk_id, text, metadata in rows:
                meta = json.loads(metadata) if metadata else {}
                meta = meta if isinstance(meta, dict) else {}
                titles = chunk_titles(meta.get("filename") or "", meta.get("title"), meta.get("heading_path") or ())
                vector, length = document_terms(text, titles, analyzer=settings.FULLTEXT_ANALYZER)
                ids.append(chunk_id)
                vectors.append(vector)
                lengths.append(length)
            cursor.execute(
                "UPDATE document_chunks AS c SET search_vector = v.sv::tsvector, search_length = v.len"
                " FROM unnest(%s::bigint[], %s::text[], %s::int[]) AS v(id, sv, len) WHERE c.id = v.id",
                [ids, vectors, lengths],
            )
        updated += len(rows)
        last_id = ids[-1]

