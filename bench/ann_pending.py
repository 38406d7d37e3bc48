"""暂不进图的分块（``RAG_ANN_PENDING_MAX_CHUNKS``）让向量检索多花多少、结果是否与精确扫描一致、插图多快（issue #22 ②）。

    RAG_DATA_DIR=/tmp/bench29 .venv/bin/python bench/fulltext_engine.py --rows 100000 --keep --no-lucene   # 先建库
    RAG_DATA_DIR=/tmp/bench29 .venv/bin/python bench/ann_pending.py --levels 0 2000 5000 10000 --queries 200

在 ``fulltext_engine.py --keep`` 留下的库（合成文本 + 校准过的合成向量，不需要 ../shared）上：先按服务的做法给它建
自己的图（``search.ann.kb_index_build``；旧条件的图在旁边按新条件重建），再逐级往库里写分块（与服务同一个
``documents.ingestion.ann_placement``，1 个写入进程），让库里暂不进图的分块依次是 ``--levels`` 个；每一级量
``search.retrieval.vector_search``（服务的检索路径：图 + 暂不进图的分块的精确扫描）的 p50 / p95，并用前 50 个查询对
精确扫描核对：前 15 名的召回，以及精确扫描的前 15 名里暂不进图的那些有没有全部找到（它们走精确扫描，应当一个不漏）。
每一级写完立刻量一遍、``VACUUM ANALYZE document_chunks`` 之后再量一遍（刚写完时 autovacuum 可能正在扫这张表）。
最后把它们插进图（``search.ann.flush_pending``，计时），再量一遍，删掉写进来的文档、把 L0 合并掉，库回到原样。

``--sustained N``：持续写入时的样子。1 个写入进程连续写 ``N`` 块，旁边 1 个进程像快队列的 worker 那样不停地插图；
上限依次取 ``--limits`` 的各值（0 = 写入时直接进图，没有插图进程），量写入进程的块/s，以及“写完、全部进图”为止的块/s。
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
import uuid
from multiprocessing.synchronize import Event

from django_setup import setup_django

setup_django()

import numpy as np  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection, connections  # noqa: E402

from bench.fulltext_engine import (  # noqa: E402
    CHUNKS_PER_DOCUMENT,
    KB_NAME,
    SEGMENTS,
    _centers,
    _documents,
    _load,
    _quantiles,
    _round,
    _vector,
    vacuum,
)
from documents.filters import SearchFilters  # noqa: E402
from documents.models import Document, DocumentChunk  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from search.ann import flush_pending, kb_index_build, kb_index_state  # noqa: E402
from search.retrieval import search_plan, vector_search  # noqa: E402

TOP_K = 15
CHECKED = 50
# 写进来的分块的序号从这里起（文本与向量不与库里已有的重复），查询向量的种子从更远处起
SEED_BASE = 300_000
QUERY_SEED_BASE = 10_000_000


def _latency(kb: KnowledgeBase, queries: list[np.ndarray]) -> tuple[dict[str, float], str]:
    """每个查询一次服务的向量检索（含读知识库状况的那条查询），毫秒；返回分位数与所用方法。"""
    times, method = [], ""
    for query in queries:
        started = time.perf_counter()
        _, method = vector_search(kb, query, SearchFilters(), TOP_K, plan=search_plan(kb))
        times.append((time.perf_counter() - started) * 1000)
    return _quantiles(times), method


def _agreement(kb: KnowledgeBase, queries: list[np.ndarray]) -> tuple[float, float]:
    """前 ``CHECKED`` 个查询对精确扫描：前 TOP_K 名的召回，与其中暂不进图的分块被找到的比例（没有时为 1）。"""
    pending = set(DocumentChunk.objects.filter(knowledge_base_id=kb.id, ann_pending=True).values_list("id", flat=True))
    found = total = pending_found = pending_total = 0
    for query in queries[:CHECKED]:
        truth = {hit.chunk_id for hit in vector_search(kb, query, SearchFilters(), TOP_K, exact=True)[0]}
        got = {hit.chunk_id for hit in vector_search(kb, query, SearchFilters(), TOP_K, plan=search_plan(kb))[0]}
        found, total = found + len(truth & got), total + len(truth)
        pending_found += len(truth & got & pending)
        pending_total += len(truth & pending)
    return found / max(total, 1), pending_found / pending_total if pending_total else 1.0


def _report(label: str, kb: KnowledgeBase, queries: list[np.ndarray], pending: int) -> dict[str, object]:
    quantiles, method = _latency(kb, queries)
    recall, pending_recall = _agreement(kb, queries)
    print(f"  {label}：暂不进图 {pending:,} 块，向量检索 p50 {quantiles['p50']:.2f} ms  p95 {quantiles['p95']:.2f} ms"
          f"（{method}）；前 {TOP_K} 名召回 {recall:.3f}，其中暂不进图的找到 {pending_recall:.3f}（负载 {_load()}）",
          flush=True)
    return {"label": label, "pending": pending, "method": method, "recall": recall, "pending_recall": pending_recall,
            **quantiles}


def _flusher(kb_id: uuid.UUID, stop: Event) -> None:
    """插图进程（fork 出来，自己连库）：像快队列的 worker 那样，有暂不进图的就插，没有就等一会儿。"""
    while not stop.is_set():
        if not flush_pending(kb_id=kb_id):
            time.sleep(0.05)
    connection.close()


def sustained(kb: KnowledgeBase, rows: int, limits: list[int]) -> None:
    """1 个写入进程连续写 ``rows`` 块，上限依次取 ``limits``；上限大于 0 时旁边有一个插图进程。"""
    context = multiprocessing.get_context("fork")
    for number, limit in enumerate(limits):
        settings.ANN_PENDING_MAX_CHUNKS = limit  # 写入进程是 fork 出来的，带着这个值
        vacuum()
        start = SEED_BASE + number * rows
        docs = {start // CHUNKS_PER_DOCUMENT + n: doc_id for n, doc_id in _documents(kb, rows).items()}
        connections.close_all()
        stop = context.Event()
        flusher = context.Process(target=_flusher, args=(kb.id, stop)) if limit else None
        if flusher:
            flusher.start()
        try:
            seconds, _ = _round(kb, range(start, start + rows), 1, docs)  # 从写入进程备好行、开始写算起
            written = time.perf_counter()
            left = DocumentChunk.objects.filter(knowledge_base_id=kb.id, ann_pending=True).count()
            stop.set()
            if flusher:
                flusher.join()
            flush_pending(kb_id=kb.id)
            total = seconds + time.perf_counter() - written
            beside = "，旁边 1 个插图进程" if limit else ""
            print(f"  持续写入 {rows:,} 块，上限 {limit:,}{beside}：写入 {rows / seconds:,.0f} 块/s，"
                  f"写完时还有 {left:,} 块没进图，全部进图为止 {rows / total:,.0f} 块/s（负载 {_load()}）", flush=True)
        finally:
            stop.set()
            Document.objects.filter(id__in=list(docs.values())).delete()
            if SEGMENTS:
                SEGMENTS.compact(kb.id)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 2000, 5000, 10000],
                        help="依次让库里暂不进图的分块是这么多个（递增，CHUNKS_PER_DOCUMENT 的倍数）")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--sustained", type=int, metavar="N",
                        help="只量持续写入：1 个写入进程连续写 N 块（见文件开头）")
    parser.add_argument("--limits", type=int, nargs="+", default=[0, 2000],
                        help="--sustained 时依次用的 RAG_ANN_PENDING_MAX_CHUNKS")
    args = parser.parse_args()
    if any(level % CHUNKS_PER_DOCUMENT for level in args.levels) or args.levels != sorted(args.levels):
        parser.error(f"--levels 须递增、是 {CHUNKS_PER_DOCUMENT} 的倍数")
    settings.ANN_PENDING_MAX_CHUNKS = max(args.levels[-1], 1)
    kb = KnowledgeBase.objects.get(name=KB_NAME)
    existing = DocumentChunk.objects.filter(knowledge_base_id=kb.id).count()
    started = time.perf_counter()
    built = kb_index_build(kb=kb)
    state = kb_index_state(kb.id)
    assert state is not None and state.valid and state.excludes_pending, state
    print(f"== {KB_NAME}：{existing:,} 块；自己的图{'重建' if built else '已有'}"
          f"（{time.perf_counter() - started:.0f} s）", flush=True)
    if args.sustained:
        sustained(kb, args.sustained, args.limits)
        return
    centers = _centers()
    queries = [_vector(QUERY_SEED_BASE + i, centers) for i in range(args.queries)]
    written, documents = 0, []
    try:
        flush_pending(kb_id=kb.id)
        vacuum()
        for level in args.levels:
            if level > written:
                docs = {(SEED_BASE + written) // CHUNKS_PER_DOCUMENT + number: doc_id
                        for number, doc_id in _documents(kb, level - written).items()}
                documents += list(docs.values())
                seconds, _ = _round(kb, range(SEED_BASE + written, SEED_BASE + level), 1, docs)
                print(f"  写入 {level - written:,} 块 {(level - written) / seconds:,.0f} 块/s", flush=True)
                written = level
            _report("写入之后", kb, queries, level)
            if level:
                # 写入之后立刻量时，autovacuum 可能正在同一台 2 核机器上扫刚写的表；VACUUM ANALYZE 之后再量一遍
                with connection.cursor() as cursor:
                    cursor.execute("VACUUM (ANALYZE) document_chunks")
                _report("VACUUM 之后", kb, queries, level)
        started = time.perf_counter()
        flushed = flush_pending(kb_id=kb.id)
        seconds = time.perf_counter() - started
        if flushed:
            print(f"  插进图：{flushed:,} 块 {seconds:.1f} s，{flushed / seconds:,.0f} 块/s（负载 {_load()}）",
                  flush=True)
        _report("插进图之后", kb, queries, 0)
    finally:
        Document.objects.filter(id__in=documents).delete()
        if SEGMENTS:
            SEGMENTS.compact(kb.id)


if __name__ == "__main__":
    main()
