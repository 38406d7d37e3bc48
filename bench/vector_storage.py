"""向量列留在行内（``STORAGE MAIN``）与精确扫描的 SQL 写法：同一批分块写两份，在同一次运行里并排计时。

    .venv/bin/python bench/vector_storage.py       # 源库默认是 fulltext_scale.py --grow 留下的 1 万分块库
    .venv/bin/python bench/vector_storage.py --source NAME --queries 100

384 维 float32 向量 1.5 KB，加上正文与 tsvector，一行超过 2 KB 时 PostgreSQL 默认先压缩、再把最大的列挪进 TOAST
表——向量不可压缩，常常被挪出去。精确扫描每行就多一次 TOAST 索引查找与一次 TOAST 页读取。这里把源库的分块复制
两份：一份按表当时的存储方式写（迁移前是 EXTENDED），一份在 ``SET STORAGE MAIN`` 之后写；再对两份分别跑
精确扫描的两种 SQL（旧：CTE 物化向量再排序；新：CTE 里算好距离只物化 (id, 距离)），报告 p50/p95 与每次查询读的
缓冲页数。结束时删掉两份副本、恢复列的存储方式。
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from django_setup import setup_django

setup_django()

from django.db import connection  # noqa: E402

from bench.fulltext_scale import _copy_rows, _kb, _without_triggers, drop  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from search.ann import _exact_sql  # noqa: E402

DIM = 384
# 改动前的精确扫描（search/ann.py 在 2026-11-25 之前的写法），留作对照
OLD_EXACT_SQL = ("WITH scoped AS MATERIALIZED (SELECT c.id, c.embedding::vector(384) AS embedding"
                 " FROM document_chunks c WHERE c.embedding_dim = 384 AND c.knowledge_base_id = %s)"
                 " SELECT id, embedding <=> %s::vector(384) AS distance FROM scoped ORDER BY distance, id LIMIT 15")
NEW_EXACT_SQL = _exact_sql(DIM, "c.knowledge_base_id = %s")


def _storage() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT attstorage FROM pg_attribute WHERE attrelid = 'document_chunks'::regclass"
                       " AND attname = 'embedding'")
        return {"x": "EXTENDED", "m": "MAIN", "e": "EXTERNAL", "p": "PLAIN"}[cursor.fetchone()[0]]


def _set_storage(storage: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE document_chunks ALTER COLUMN embedding SET STORAGE {storage}")


def _time(kb: KnowledgeBase, sql: str, queries: list[str], new: bool) -> tuple[float, float, float]:
    """p50、p95（毫秒）与一次查询读的缓冲页数。"""
    times = []
    with connection.cursor() as cursor:
        for query in queries:
            params: list[Any] = [query, kb.id, 15] if new else [kb.id, query]
            started = time.perf_counter()
            cursor.execute(sql, params)
            cursor.fetchall()
            times.append((time.perf_counter() - started) * 1000)
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0][0]["Plan"]
    times.sort()
    buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    return statistics.median(times), times[round(0.95 * (len(times) - 1))], buffers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="bench-fulltext-10k")
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    source = KnowledgeBase.objects.get(name=args.source)
    original = _storage()
    copies = {}
    try:
        for number, storage in enumerate(("EXTENDED", "MAIN"), start=1):
            _set_storage(storage)
            kb = copies[storage] = _kb(f"bench-storage-{storage.lower()}")
            with _without_triggers() as cursor:
                _copy_rows(cursor, source, kb, 100 + number, documents="TRUE", vectors=True)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE) document_chunks")
            cursor.execute("SELECT embedding::text FROM document_chunks WHERE knowledge_base_id = %s"
                           " ORDER BY md5(id::text) LIMIT %s", [source.id, args.queries + 10])
            queries = [row[0] for row in cursor.fetchall()]
        print(f"{'存储':<10}{'SQL':<6}{'p50 ms':>10}{'p95 ms':>10}{'缓冲页':>10}")
        for storage, kb in copies.items():
            for name, sql in (("old", OLD_EXACT_SQL), ("new", NEW_EXACT_SQL)):
                _time(kb, sql, queries[:10], name == "new")  # 预热
                p50, p95, buffers = _time(kb, sql, queries[10:], name == "new")
                print(f"{storage:<10}{name:<6}{p50:>10.1f}{p95:>10.1f}{buffers:>10}", flush=True)
    finally:
        _set_storage(original)
        drop(list(copies.values()))


if __name__ == "__main__":
    main()
