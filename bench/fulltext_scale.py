"""全文与混合检索的数据库耗时随规模的变化：BM25（倒排表）与 ts_rank_cd 在同一次运行里并排测量。

    .venv/bin/python bench/fulltext_scale.py --rows 100000 --queries 200
    .venv/bin/python bench/fulltext_scale.py --rows 1000000 --queries 200 --no-vectors

合成数据（不需要 ../shared）：中文文本按 jieba 词典的词频抽词拼句（词频分布接近真实语料的 Zipf 分布），
夹少量英文词与数字，每块 80~400 字；向量是围绕 64 个簇中心的单位向量（384 维）。一张表里先放三个知识库：
占 10%、1% 的两个目标库和其余的填充库；测完后把全部行划给一个知识库，再测“目标库占 100%”。

批量写入绕过触发器（``session_replication_role = replica``，整批 COPY），写完再用 ``search.bm25.rebuild_statistics``
（测试里核对过它与触发器逐条维护的结果完全相同）一次性重算统计与倒排表：先去掉倒排表主键、插完再排序建索引，
比一亿行逐条插入 B 树快一个量级。服务里的写入仍走触发器；这里只为在一台 2 核机器上装得下 1M 行。

查询：从目标库的文本里随机截 6~30 字的片段（有时拼两个片段，模拟长问题），每种方式先预热 20 个。
计时的是检索服务里与模型无关的部分：全文路 ``fulltext_search``；混合是向量路 + 全文路 + 融合
（``services.search`` 用预先算好的查询向量，不含模型时间）。
"""

from __future__ import annotations

import argparse
import bisect
import os
import random
import statistics
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import Pool
from multiprocessing.pool import Pool as WorkerPool
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")
os.environ.setdefault("RAG_LOG_LEVEL", "warning")

import django  # noqa: E402

django.setup()

import numpy as np  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402

from documents.models import Document  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from search import bm25, services  # noqa: E402
from search.fulltext import document_terms, parse_query  # noqa: E402
from search.retrieval import SearchFilters, fulltext_search  # noqa: E402

DIM = 384
CHUNKS_PER_DOCUMENT = 500
ENGLISH = ["the", "patient", "blood", "pressure", "liver", "function", "test", "result", "report", "system",
           "data", "model", "api", "python", "service"]


def _vocabulary() -> tuple[list[str], list[int]]:
    import jieba

    words, cumulative, total = [], [], 0
    with open(Path(jieba.__file__).parent / "dict.txt", encoding="utf-8") as handle:
        for line in handle:
            word, freq, *_ = line.split()
            if not all("\u4e00" <= ch <= "\u9fff" for ch in word):
                continue
            total += int(freq)
            words.append(word)
            cumulative.append(total)
    return words, cumulative


_VOCAB: tuple[list[str], list[int]] | None = None


def _text(seed: int) -> str:
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = _vocabulary()
    words, cumulative = _VOCAB
    rng = random.Random(seed)
    target, parts, size = rng.randint(80, 400), [], 0
    while size < target:
        if rng.random() < 0.04:
            word = rng.choice(ENGLISH) if rng.random() < 0.7 else str(rng.randint(1, 2030))
            word = f" {word} "
        else:
            word = words[bisect.bisect_left(cumulative, rng.randint(1, cumulative[-1]))]
        parts.append(word)
        size += len(word)
        if rng.random() < 0.08:
            parts.append("，" if rng.random() < 0.7 else "。")
    return "".join(parts)


def _row(seed: int) -> tuple[str, str, int]:
    text = _text(seed)
    vector, length = document_terms(text, (f"doc-{seed // CHUNKS_PER_DOCUMENT}.txt",))
    return text, vector, length


def _centers() -> np.ndarray:
    centers = np.random.default_rng(0).normal(size=(64, DIM)).astype(np.float32)
    return centers / np.linalg.norm(centers, axis=1, keepdims=True)


def _vector(seed: int, centers: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = centers[seed % len(centers)] + rng.normal(scale=0.6 / np.sqrt(DIM) * 4, size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


@contextmanager
def _without_triggers() -> Iterator[Any]:
    """本会话的写入不触发触发器（``session_replication_role = replica``）：批量写入后统一重算统计。"""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            yield cursor
        finally:
            cursor.execute("RESET session_replication_role")


def load(kb: KnowledgeBase, seeds: range, vectors: bool, pool: WorkerPool) -> float:
    """按 COPY 写入 ``seeds`` 对应的分块（每 500 个一份 completed 文档），不经触发器；返回耗时（秒）。"""
    started = time.perf_counter()
    centers = _centers()
    batch = 20_000
    for start in range(seeds.start, seeds.stop, batch):
        chunk_seeds = range(start, min(start + batch, seeds.stop))
        docs = {}
        for seed in chunk_seeds:
            number = seed // CHUNKS_PER_DOCUMENT
            if number not in docs:
                docs[number] = Document(id=uuid.uuid4(), knowledge_base=kb, filename=f"doc-{number}.txt",
                                        status=Document.Status.COMPLETED, chunk_count=CHUNKS_PER_DOCUMENT)
        Document.objects.bulk_create(docs.values())
        rows = pool.map(_row, chunk_seeds, chunksize=500)
        with _without_triggers() as cursor, cursor.cursor.copy(
            "COPY document_chunks (knowledge_base_id, document_id, chunk_index, chunk_text, metadata, embedding,"
            " embedding_dim, role, token_count, text_hash, search_vector, search_length, created_at) FROM STDIN"
        ) as copy:
            for seed, (text, vector, length) in zip(chunk_seeds, rows, strict=True):
                embedding = "[" + ",".join(f"{x:.5f}" for x in _vector(seed, centers)) + "]" if vectors else None
                copy.write_row((kb.id, docs[seed // CHUNKS_PER_DOCUMENT].id, seed % CHUNKS_PER_DOCUMENT, text,
                                "{}", embedding, DIM if vectors else None, "chunk", len(text), "", vector, length,
                                "2026-01-01T00:00:00Z"))
        print(f"  loaded {min(start + batch, seeds.stop) - seeds.start:,} rows into {kb.name}", flush=True)
    return time.perf_counter() - started


def build_statistics(kbs: list[KnowledgeBase]) -> float:
    """按分块一次性重算这些知识库的统计与倒排表（倒排表主键先去掉、最后排序重建）；返回耗时（秒）。"""
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '1GB'")
        cursor.execute("ALTER TABLE fulltext_postings DROP CONSTRAINT fulltext_postings_pkey")
        for kb in kbs:
            bm25.rebuild_statistics(kb.id)
        cursor.execute("ALTER TABLE fulltext_postings ADD PRIMARY KEY (knowledge_base_id, lexeme, impact, chunk_id)"
                       " INCLUDE (title_tf, body_tf, length)")
        cursor.execute("ANALYZE document_chunks; ANALYZE fulltext_postings; ANALYZE fulltext_term_stats")
    return time.perf_counter() - started


def drop(kbs: list[KnowledgeBase]) -> None:
    """删掉基准数据：分块不经触发器直接删，统计行随后按知识库删除（逐条维护一亿行倒排要几个小时）。"""
    ids = [kb.id for kb in kbs]
    with _without_triggers() as cursor:
        cursor.execute("DELETE FROM document_chunks WHERE knowledge_base_id = ANY(%s)", [ids])
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM fulltext_postings WHERE knowledge_base_id = ANY(%s)", [ids])
        cursor.execute("DELETE FROM fulltext_term_stats WHERE knowledge_base_id = ANY(%s)", [ids])
        cursor.execute("DELETE FROM fulltext_kb_stats WHERE knowledge_base_id = ANY(%s)", [ids])
    for kb in kbs:
        kb.delete()


def _queries(seeds: range, count: int) -> list[str]:
    rng = random.Random(7)
    queries = []
    for _ in range(count):
        text = _text(rng.choice(seeds))
        start = rng.randrange(max(1, len(text) - 30))
        query = text[start:start + rng.randint(6, 30)]
        if rng.random() < 0.3:  # 长问题：再拼一段
            other = _text(rng.choice(seeds))
            query += other[:rng.randint(10, 30)]
        queries.append(query)
    return queries


def _percentiles(values: list[float]) -> str:
    values = sorted(values)
    p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
    return f"p50 {statistics.median(values):6.1f} ms  p95 {p95:6.1f} ms"


def measure(kb: KnowledgeBase, queries: list[str], vectors: bool,
            rankings: tuple[str, ...] = ("bm25", "ts_rank_cd")) -> dict[str, str]:
    results = {}
    centers = _centers()
    for ranking in rankings:
        settings.FULLTEXT_RANKING = ranking
        for query in queries[:20]:
            fulltext_search(kb, parse_query(query), SearchFilters(), 15)
        times = []
        for query in queries:
            started = time.perf_counter()
            fulltext_search(kb, parse_query(query), SearchFilters(), 50)
            times.append((time.perf_counter() - started) * 1000)
        results[f"fulltext {ranking}"] = _percentiles(times)
        print(f"  {kb.name} fulltext {ranking}: {results[f'fulltext {ranking}']}", flush=True)
        if not vectors:
            continue
        times = []
        original = services.embed_query
        # 查询向量按文本确定地生成：只测数据库与融合，不含模型时间
        services.embed_query = lambda provider, model, text: (  # type: ignore[assignment]
            _vector(zlib.crc32(text.encode()), centers), True)
        try:
            for i, query in enumerate(queries):
                started = time.perf_counter()
                services.search(kb, services.SearchRequest(query=query, top_k=5, rerank=False))
                if i >= 20:
                    times.append((time.perf_counter() - started) * 1000)
        finally:
            services.embed_query = original  # type: ignore[assignment]
        results[f"hybrid {ranking}"] = _percentiles(times)
        print(f"  {kb.name} hybrid {ranking}: {results[f'hybrid {ranking}']}", flush=True)
    settings.FULLTEXT_RANKING = "bm25"
    return results


def _kb(name: str) -> KnowledgeBase:
    KnowledgeBase.objects.filter(name=name).delete()
    return KnowledgeBase.objects.create(name=name, description="bench/fulltext_scale.py")


def _sizes() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('document_chunks')),"
                       " pg_size_pretty(pg_total_relation_size('fulltext_postings')),"
                       " pg_size_pretty(pg_total_relation_size('fulltext_term_stats'))")
        chunks, postings, terms = cursor.fetchone()
    return f"document_chunks {chunks}, fulltext_postings {postings}, fulltext_term_stats {terms}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--no-vectors", action="store_true", help="只测全文（不写向量，不测混合）")
    parser.add_argument("--keep", action="store_true", help="结束后保留数据")
    parser.add_argument("--reuse", action="store_true",
                        help="只重测 --keep 留下的“占 100%%”知识库（不重新写入）")
    parser.add_argument("--rankings", default="bm25,ts_rank_cd", help="要测的排序，逗号分隔")
    args = parser.parse_args()
    vectors = not args.no_vectors
    rows = args.rows
    rankings = tuple(args.rankings.split(","))
    if args.reuse:
        whole = KnowledgeBase.objects.get(name="bench-fulltext-100pct")
        measure(whole, _queries(range(0, rows), args.queries), vectors, rankings)
        return
    with Pool(os.cpu_count() or 2) as pool:
        print(f"== 目标库占 10% 与 1%：{rows:,} 行，三个知识库", flush=True)
        ten, one, rest = _kb("bench-fulltext-10pct"), _kb("bench-fulltext-1pct"), _kb("bench-fulltext-filler")
        seconds = load(ten, range(0, rows // 10), vectors, pool)
        seconds += load(one, range(rows // 10, rows // 10 + rows // 100), vectors, pool)
        seconds += load(rest, range(rows // 10 + rows // 100, rows), vectors, pool)
    print(f"  写入 {seconds:.0f} s（{rows / seconds:,.0f} 行/s，含 tsvector 生成）", flush=True)
    seconds = build_statistics([ten, one, rest])
    print(f"  统计与倒排表 {seconds:.0f} s；{_sizes()}", flush=True)
    report = {"10%": measure(ten, _queries(range(0, rows // 10), args.queries), vectors, rankings)}
    report["1%"] = measure(one, _queries(range(rows // 10, rows // 10 + rows // 100), args.queries), vectors,
                          rankings)
    print(f"== 目标库占 100%：同一批 {rows:,} 行划给一个知识库", flush=True)
    whole = _kb("bench-fulltext-100pct")
    with _without_triggers() as cursor:
        cursor.execute("UPDATE documents SET knowledge_base_id = %s WHERE knowledge_base_id = ANY(%s)",
                       [whole.id, [ten.id, one.id, rest.id]])
        cursor.execute("UPDATE document_chunks SET knowledge_base_id = %s WHERE knowledge_base_id = ANY(%s)",
                       [whole.id, [ten.id, one.id, rest.id]])
    drop([ten, one, rest])
    seconds = build_statistics([whole])
    print(f"  统计与倒排表 {seconds:.0f} s；{_sizes()}", flush=True)
    report["100%"] = measure(whole, _queries(range(0, rows), args.queries), vectors, rankings)
    if not args.keep:
        drop([whole])
    print(f"\n结果（{rows:,} 行，每种 {args.queries} 个查询，数据库耗时）")
    for share, values in report.items():
        for name, line in values.items():
            print(f"  {share:>4}  {name:<20} {line}")


if __name__ == "__main__":
    main()
