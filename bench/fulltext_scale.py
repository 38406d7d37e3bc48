"""全文与混合检索的数据库耗时随规模的变化：BM25（倒排表）与 ts_rank_cd 在同一次运行里并排测量。

    .venv/bin/python bench/fulltext_scale.py --rows 100000 --queries 200
    .venv/bin/python bench/fulltext_scale.py --rows 100000 --queries 200 --keep
    .venv/bin/python bench/fulltext_scale.py --grow 10 --queries 200 --slow-queries 20   # 由保留的 100k 库扩到 1.11M 行
    .venv/bin/python bench/fulltext_scale.py --measure bench-fulltext-100pct bench-fulltext-100k-5seg --prewarm

合成数据（不需要 ../shared）：中文文本按 jieba 词典的词频抽词拼句（词频分布接近真实语料的 Zipf 分布），
夹少量英文词与数字，每块 80~400 字；向量是围绕 64 个簇中心的单位向量（384 维）。一张表里先放三个知识库：
占 10%、1% 的两个目标库和其余的填充库；测完后把全部行划给一个知识库，再测“目标库占 100%”。

批量写入绕过触发器（``session_replication_role = replica``，整批 COPY），写完再用 ``search.segments.rebuild``
（测试里核对过它与触发器逐条维护的结果完全相同）一次性重算统计与倒排表：先去掉倒排表主键、插完再排序建索引，
比一亿行逐条插入 B 树快一个量级。服务里的写入仍走触发器；这里只为在一台 2 核机器上装得下 1M 行。

查询：从目标库的文本里随机截 6~30 字的片段（有时拼两个片段，模拟长问题），每种方式先预热 20 个。
``--prewarm``：计时前把目标库那一段倒排主键整段读一遍（进操作系统缓存）——测“倒排常驻内存”的稳态；不加时测的是
刚启动、缓存里几乎没有倒排的最坏情况（每个查询的倒排页大多要从磁盘读）。
计时的是检索服务里与模型无关的部分：全文路 ``fulltext_search``；混合是向量路 + 全文路 + 融合
（``services.search`` 用预先算好的查询向量，不含模型时间）。调用方式与服务进程相同：计时前 ``gc.freeze()``，
查询不包在外层事务里。
"""

from __future__ import annotations

import argparse
import bisect
import gc
import os
import random
import statistics
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
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
from django.db import OperationalError, connection  # noqa: E402

from documents.filters import SearchFilters  # noqa: E402
from documents.models import Document  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from raglib.analysis import document_terms, parse_query  # noqa: E402
from search import segments, services  # noqa: E402
from search.ann import kb_index_build  # noqa: E402
from search.retrieval import fulltext_search  # noqa: E402

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
    title = f"doc-{seed // CHUNKS_PER_DOCUMENT}.txt"
    vector, length = document_terms(text, (title,), analyzer=settings.FULLTEXT_ANALYZER)
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
    """按分块一次性建起这些知识库的全文索引（``search.segments.rebuild``：放进 L0、合并成段）；返回耗时（秒）。"""
    started = time.perf_counter()
    for kb in kbs:
        segments.rebuild(kb.id)
    _vacuum()
    return time.perf_counter() - started


def _vacuum() -> None:
    """批量写入后先 VACUUM 再测：倒排表的仅索引扫描要靠可见性映射，刚写入、还没被清理过的页每行都要回表。

    1M 行时不清理的 BM25 全文路 p50 262 ms / p95 902 ms（2 万行倒排回表 1 万次）。服务里倒排由触发器持续写入，
    由 autovacuum 按插入量清理（迁移 ``search.0003`` 把倒排表的插入阈值调低了）。
    """
    with connection.cursor() as cursor:
        for table in ("fulltext_blocks", "fulltext_dictionary", "fulltext_docs", "document_chunks", "documents"):
            cursor.execute(f"VACUUM (ANALYZE) {table}")


def drop(kbs: list[KnowledgeBase]) -> None:
    """删掉基准数据：分块不经触发器直接删，统计与倒排走清理任务的快路（逐条维护一亿行倒排要几个小时）。"""
    with _without_triggers() as cursor:
        cursor.execute("DELETE FROM document_chunks WHERE knowledge_base_id = ANY(%s)", [[kb.id for kb in kbs]])
    for kb in kbs:
        segments.drop(kb.id)
        kb.delete()


# 复制出来的分块 id = 原 id + 份号 * 这个偏移：与序列发出的 id（远小于它）永不相撞，也能从 id 认出是哪一份
_COPY_OFFSET = 10**10
# 小库的份号：大库用 1..COPIES，小库取一个不会与 --grow 的份数相撞的号
_SMALL_COPY = 100


def _columns(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s"
                       " ORDER BY ordinal_position", [table])
        return [name for (name,) in cursor.fetchall()]


def _copy_rows(cursor: Any, source: KnowledgeBase, target: KnowledgeBase, copy: int, *, documents: str,
               vectors: bool) -> None:
    """把 ``source`` 里满足 ``documents`` 条件的文档与它们的分块复制一份到 ``target``（第 ``copy`` 份）。

    文档 id 由原 id 与份号散列出来，分块 id 加上 ``copy * _COPY_OFFSET``；``vectors`` 为假时不复制向量（不进 HNSW）。
    替换进 SQL 的只有 uuid、整数与本文件里写死的条件。
    """
    def document_id(column: str) -> str:
        return f"md5({column}::text || ':{copy}')::uuid"

    def select(table: str, replaced: dict[str, str]) -> str:
        columns = _columns(table)
        return f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(replaced.get(c, c) for c in columns)}"

    target_id = f"'{target.id}'::uuid"
    cursor.execute(select("documents", {"id": document_id("id"), "knowledge_base_id": target_id})
                   + f" FROM documents WHERE knowledge_base_id = %s AND {documents}", [source.id])
    replaced = {"id": f"id + {copy * _COPY_OFFSET}", "knowledge_base_id": target_id,
                "document_id": document_id("document_id"), "parent_id": f"parent_id + {copy * _COPY_OFFSET}"}
    if not vectors:
        replaced |= {"embedding": "NULL", "embedding_dim": "NULL"}
    scope = f"document_id IN (SELECT id FROM documents WHERE knowledge_base_id = %s AND {documents})"  # noqa: S608
    cursor.execute(select("document_chunks", replaced) + " FROM document_chunks WHERE knowledge_base_id = %s AND "
                   + scope, [source.id, source.id])


def grow_large(source: KnowledgeBase, copies: int) -> KnowledgeBase:
    """由保留的 100k 库复制 ``copies`` 份组成大库，把表扩到 1M 级（原库约占 9%）。

    每段文本出现 ``copies`` 次（同一词表上 10 倍语料的形状），全文索引按分块建（放进 L0、合并成段）。
    大库不复制向量：它自己的 HNSW 图在这台机器上要建四十分钟以上（见“向量路随规模”），所以大库只测全文路。
    """
    large = _kb("bench-fulltext-1m")
    started = time.perf_counter()
    with _without_triggers() as cursor:
        for copy in range(1, copies + 1):
            _copy_rows(cursor, source, large, copy, documents="TRUE", vectors=False)
            print(f"  copied {copy}/{copies}", flush=True)
    print(f"  复制分块 {time.perf_counter() - started:.0f} s", flush=True)
    started = time.perf_counter()
    build_statistics([large])
    print(f"  全文索引（L0 + 合并成段）与 VACUUM {time.perf_counter() - started:.0f} s；{_sizes()}", flush=True)
    return large


def grow_small(source: KnowledgeBase) -> KnowledgeBase:
    """原库前 20 篇文档（1 万分块，含向量）复制成小库，约占 1M 行的 1%；全文索引按分块建。"""
    small = _kb("bench-fulltext-10k")
    first_documents = "filename IN (" + ", ".join(f"'doc-{n}.txt'" for n in range(20)) + ")"
    with _without_triggers() as cursor:
        _copy_rows(cursor, source, small, _SMALL_COPY, documents=first_documents, vectors=True)
    build_statistics([small])
    return small


def _queries(seeds: range, count: int, text_of: Callable[[int], str] = _text) -> list[str]:
    rng = random.Random(7)
    queries = []
    for _ in range(count):
        text = text_of(rng.choice(seeds))
        start = rng.randrange(max(1, len(text) - 30))
        query = text[start:start + rng.randint(6, 30)]
        if rng.random() < 0.3:  # 长问题：再拼一段
            other = text_of(rng.choice(seeds))
            query += other[:rng.randint(10, 30)]
        queries.append(query)
    return queries


_SLOW_TIMEOUT_MS = 60_000


def _percentiles(values: list[float]) -> str:
    values = sorted(values)
    p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
    return f"p50 {statistics.median(values):6.1f} ms  p95 {p95:6.1f} ms"


def prewarm(kb: KnowledgeBase) -> None:
    """把知识库的词典块与倒排块读一遍（进操作系统缓存）：BM25 的查询只读它们（外加候选分块的回表）。"""
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(length(data)) FROM (SELECT data FROM fulltext_blocks WHERE knowledge_base_id = %s"
                       " UNION ALL SELECT data FROM fulltext_dictionary WHERE knowledge_base_id = %s) x",
                       [kb.id, kb.id])
        size = cursor.fetchone()[0] or 0
    print(f"  预读倒排 {size / 2**20:,.0f} MB，{time.perf_counter() - started:.0f} s", flush=True)


def measure(kb: KnowledgeBase, queries: list[str], vectors: bool,
            rankings: tuple[str, ...] = ("bm25", "ts_rank_cd"), slow_queries: int | None = None,
            warm: bool = False) -> dict[str, str]:
    """``slow_queries``：``ts_rank_cd`` 只测前这么多个查询，每个最多 ``_SLOW_TIMEOUT_MS``（1M 行时一个要几十秒）。
    ``warm``：先 :func:`prewarm`。"""
    if warm:
        prewarm(kb)
    # 与服务进程一样冻结启动后就在的对象（ragservice/gunicorn_conf.py 的 post_worker_init）：否则每两百来个查询就有一次
    # 约 60 ms 的完整分代回收落在某个查询里，测到的是基准进程的长尾，不是服务的
    gc.collect()
    gc.freeze()
    results = {}
    centers = _centers()
    for ranking in rankings:
        settings.FULLTEXT_RANKING = ranking
        timed = queries if ranking == "bm25" or slow_queries is None else queries[:slow_queries]
        for query in queries[:20 if timed is queries else 3]:
            fulltext_search(kb, parse_query(query, analyzer=settings.FULLTEXT_ANALYZER), SearchFilters(), 15)
        times, timeouts = [], 0
        with connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {_SLOW_TIMEOUT_MS}")
        for query in timed:
            started = time.perf_counter()
            # 与服务一样不在外层事务里调用（自动提交）：BM25 自己开只读的快照事务，包一层事务会把它变成保存点
            try:
                fulltext_search(kb, parse_query(query, analyzer=settings.FULLTEXT_ANALYZER), SearchFilters(), 50)
            except OperationalError:  # 超时按上限计（QueryCanceled）
                timeouts += 1
            times.append((time.perf_counter() - started) * 1000)
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")
        results[f"fulltext {ranking}"] = _percentiles(times) + (
            f"  ({len(timed)} 个查询，{timeouts} 个超过 {_SLOW_TIMEOUT_MS // 1000} s 按上限计)"
            if timed is not queries or timeouts else "")
        print(f"  {kb.name} fulltext {ranking}: {results[f'fulltext {ranking}']}", flush=True)
        if not vectors:
            continue
        times = []
        original = services.embed_query
        # 查询向量按文本确定地生成：只测数据库与融合，不含模型时间
        services.embed_query = lambda provider, model, text: (  # type: ignore[assignment]
            _vector(zlib.crc32(text.encode()), centers), True)
        try:
            # 与全文路一样：ts_rank_cd 限了查询数时只测前 20 个（预热）+ 限定的个数
            for i, query in enumerate(queries if timed is queries else queries[:20 + len(timed)]):
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
                       " pg_size_pretty(sum(pg_total_relation_size(c.oid))) FROM pg_class c"
                       " WHERE c.relkind = 'r' AND starts_with(c.relname, 'fulltext_')")
        chunks, fulltext = cursor.fetchone()
    return f"document_chunks {chunks}, 全文引擎的表 {fulltext}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--no-vectors", action="store_true", help="只测全文（不写向量，不测混合）")
    parser.add_argument("--keep", action="store_true", help="结束后保留数据")
    parser.add_argument("--reuse", action="store_true",
                        help="只重测 --keep 留下的“占 100%%”知识库（不重新写入）")
    parser.add_argument("--rankings", default="bm25,ts_rank_cd", help="要测的排序，逗号分隔")
    parser.add_argument("--grow", type=int, metavar="COPIES",
                        help="由 --keep 留下的 100k 库复制 COPIES 份组成大库（另加 1 万分块的小库），测三个库")
    parser.add_argument("--slow-queries", type=int, help="ts_rank_cd 只测前这么多个查询（每个最多 60 s）")
    parser.add_argument("--prewarm", action="store_true", help="计时前把目标库的倒排主键读进缓存（常驻内存的稳态）")
    parser.add_argument("--measure", nargs="+", metavar="KB",
                        help="只测这些已有知识库的全文路（查询取自前 --rows 个源文本，如由 100k 库复制、段数不同的库）")
    args = parser.parse_args()
    vectors = not args.no_vectors
    rows = args.rows
    rankings = tuple(args.rankings.split(","))
    if args.measure:
        for name in args.measure:
            measure(KnowledgeBase.objects.get(name=name), _queries(range(0, rows), args.queries), False, rankings,
                    args.slow_queries, args.prewarm)
        return
    if args.reuse or args.grow:
        whole = KnowledgeBase.objects.get(name="bench-fulltext-100pct")
        if not args.grow:
            measure(whole, _queries(range(0, rows), args.queries), vectors, rankings, args.slow_queries, args.prewarm)
            return
        # 已有的大库 / 小库直接复用（删掉小库再跑就只重建它，例如改了向量列的存储方式之后）
        large = (KnowledgeBase.objects.filter(name="bench-fulltext-1m").first() or grow_large(whole, args.grow))
        small = KnowledgeBase.objects.filter(name="bench-fulltext-10k").first() or grow_small(whole)
        kb_index_build(kb=whole)
        report = {}
        for share, kb, seeds, kb_vectors in (("1M", large, range(0, rows), False),
                                            ("100k", whole, range(0, rows), vectors),
                                            ("10k", small, range(0, rows // 10), vectors)):
            print(f"== {kb.name}", flush=True)
            report[share] = measure(kb, _queries(seeds, args.queries), kb_vectors, rankings, args.slow_queries,
                                    args.prewarm)
        for share, values in report.items():
            for name, line in values.items():
                print(f"  {share:>4}  {name:<20} {line}")
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
