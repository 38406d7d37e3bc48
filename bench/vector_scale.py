"""向量路随规模的召回与数据库耗时：目标知识库占全表 100% / 10% / 1%，各种 ANN 做法在同一次运行里并排测量。

    .venv/bin/python bench/vector_scale.py --rows 100000 --shares 0.1 0.01 --keep     # 装载 + 测量，保留数据
    .venv/bin/python bench/vector_scale.py --reuse --shares 0.1 0.01                   # 复用上次 --keep 的数据
    .venv/bin/python bench/vector_scale.py --rows 100000 --shares 1.0                  # 目标库独占整表

数据来自 ``bench/scale_data.py``（校准过的合成向量，不需要 ../shared；只装向量，``search_vector`` 为 NULL）。
对每个目标库：以精确扫描为 ground truth，计算候选 15（top_k=5）与 100 的召回，以及单次向量检索的 p50/p95
（``search.retrieval.vector_search``，数据库耗时，不含模型）。比较的做法：

- ``exact``：精确扫描；
- ``shared``：共享的按维度 HNSW 索引 + 迭代扫描（知识库还没有自己的索引时的路径）；
- ``kb_index``/``kb_index:halfvec``/``kb_index:binary``：知识库自己的部分 HNSW 索引（float32 / 半精度 /
  二值量化 + 精确重排），各自的建索引时间与大小；
- ``auto``：服务实际的选择（``exact=None``，建完 ``kb_indexes_sync`` 之后）。
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")
os.environ.setdefault("RAG_LOG_LEVEL", "warning")

import django  # noqa: E402

django.setup()

import numpy as np  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402

from bench.scale_data import ScaleData, drop_scale_data, load_scale_data, query_vectors, relation_sizes  # noqa: E402
from documents.filters import SearchFilters  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from search import ann  # noqa: E402
from search.retrieval import PathHit, vector_search  # noqa: E402

LIMITS = (15, 100)
Search = Callable[[np.ndarray, int], tuple[list[PathHit], str]]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def evaluate(truth: dict[int, list[set[int]]], queries: np.ndarray, search: Search) -> dict[str, object]:
    """召回（相对精确扫描）与候选 15 时的延迟；每个查询都要拿满候选。"""
    recalls: dict[int, list[float]] = {limit: [] for limit in LIMITS}
    times: list[float] = []
    methods: set[str] = set()
    search(queries[0], LIMITS[0])  # 预热：打开索引、读系统目录
    for limit in LIMITS:
        for i, query in enumerate(queries):
            started = time.perf_counter()
            hits, method = search(query, limit)
            if limit == LIMITS[0]:
                times.append((time.perf_counter() - started) * 1000)
            methods.add(method)
            if len(hits) != limit:
                raise AssertionError(f"{method}: only {len(hits)} of {limit} candidates")
            recalls[limit].append(len(truth[limit][i] & {h.chunk_id for h in hits}) / limit)
    return {"methods": ",".join(sorted(methods)), "p50": statistics.median(times), "p95": _percentile(times, 0.95),
            **{f"recall@{limit}": float(np.mean(values)) for limit, values in recalls.items()}}


def _line(share: str, name: str, result: dict[str, object], extra: str = "") -> str:
    return (f"| {share} | {name} | {result['recall@15']:.3f} | {result['recall@100']:.3f} | {result['p50']:.1f} |"
            f" {result['p95']:.1f} | {result['methods']} | {extra} |")


def _mb(size: int) -> str:
    return f"{size / 2**20:.0f} MB"


def _truth(kb: KnowledgeBase, queries: np.ndarray) -> dict[int, list[set[int]]]:
    """精确扫描的 ground truth：每个查询只扫一次（取最大的候选数，较小的取其前缀；精确扫描按 (距离, id) 排序）。"""
    ranked = [[h.chunk_id for h in vector_search(kb, q, SearchFilters(), max(LIMITS), exact=True)[0]]
              for q in queries]
    return {limit: [set(ids[:limit]) for ids in ranked] for limit in LIMITS}


def _label(kb: KnowledgeBase, rows: int) -> str:
    chunks = _chunks(kb)
    return f"{chunks / rows * 100:.0f}%（{chunks:,}）"


def measure_kb(kb: KnowledgeBase, label: str, queries: np.ndarray, compressions: list[str],
               emit: Callable[[str], None]) -> dict[int, list[set[int]]]:
    """一个目标库的全部做法，返回 ground truth。压缩方式按给定顺序逐个建索引、测量、删掉；最后一个保留给 auto。"""
    filters = SearchFilters()
    truth = _truth(kb, queries)
    emit(_line(label, "exact", evaluate(truth, queries, lambda q, n: vector_search(kb, q, filters, n, exact=True))))
    ann.kb_index_drop(kb_id=kb.id)
    emit(_line(label, f"shared（ef_search={settings.HNSW_EF_SEARCH}）",
               evaluate(truth, queries, lambda q, n: vector_search(kb, q, filters, n, exact=False))))
    for position, compression in enumerate(compressions):
        kb.vector_compression = compression
        kb.save(update_fields=["vector_compression"])
        started = time.perf_counter()
        ann.kb_index_build(kb=kb)
        seconds = time.perf_counter() - started
        size = relation_sizes(connection, [ann.kb_index_name(kb.id)])[ann.kb_index_name(kb.id)]
        name = "kb_index" if compression == "none" else f"kb_index:{compression}"
        result = evaluate(truth, queries, lambda q, n: vector_search(kb, q, filters, n, exact=False))
        emit(_line(label, name, result, f"建索引 {seconds:.0f} s，{_mb(size)}"))
        if position < len(compressions) - 1:
            ann.kb_index_drop(kb_id=kb.id)
    return truth


def _chunks(kb: KnowledgeBase) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM document_chunks WHERE knowledge_base_id = %s", [kb.id])
        return int(cursor.fetchone()[0])


def measure_auto(data: ScaleData, queries: np.ndarray, known: dict[uuid.UUID, dict[int, list[set[int]]]],
                 emit: Callable[[str], None], *, filler: bool = True) -> None:
    """服务实际的选择（exact=None）。目标库先测（它们自己的索引 measure_kb 已建好）；填充库先测共享索引，
    再跑一次定时任务的同步（按规则给它建自己的索引，1M 规模时最久的一步），最后测它的 auto。"""
    filters = SearchFilters()

    def auto(kb: KnowledgeBase, truth: dict[int, list[set[int]]]) -> None:
        emit(_line(_label(kb, data.rows), "auto", evaluate(truth, queries,
                                                           lambda q, n: vector_search(kb, q, filters, n))))

    for kb in data.kbs.values():
        auto(kb, known[kb.id])
    if data.filler is None or not filler:
        return
    rest = data.filler
    truth = _truth(rest, queries)
    emit(_line(_label(rest, data.rows), f"shared（ef_search={settings.HNSW_EF_SEARCH}）",
               evaluate(truth, queries, lambda q, n: vector_search(rest, q, filters, n, exact=False))))
    started = time.perf_counter()
    changes = ann.kb_indexes_sync()
    print(f"  kb_indexes_sync {time.perf_counter() - started:.0f} s: {changes}", flush=True)
    size = relation_sizes(connection, [ann.kb_index_name(rest.id)]).get(ann.kb_index_name(rest.id), 0)
    print(f"  {rest.name} 自己的索引 {_mb(size)}", flush=True)
    auto(rest, truth)


def _existing(prefix: str, shares: list[float], dim: int) -> ScaleData:
    kbs = {share: KnowledgeBase.objects.get(name=f"{prefix}-{share * 100:g}pct") for share in shares}
    filler = KnowledgeBase.objects.filter(name=f"{prefix}-filler").first()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM document_chunks")
        rows = int(cursor.fetchone()[0])
    return ScaleData(rows=rows, dim=dim, kbs=kbs, filler=filler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--shares", type=float, nargs="+", default=[0.10, 0.01])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--compressions", nargs="*", default=["binary", "halfvec", "none"],
                        help="依次测量的压缩方式；最后一个的索引保留给 auto")
    parser.add_argument("--reuse", action="store_true", help="复用上次 --keep 留下的 scale-* 知识库")
    parser.add_argument("--keep", action="store_true", help="结束后保留数据（之后可 --reuse）")
    parser.add_argument("--skip-filler", action="store_true",
                        help="不测填充库（1M 行时给它建自己的索引要四十分钟以上）")
    args = parser.parse_args()
    if args.reuse:
        data = _existing("scale", args.shares, args.dim)
    else:
        data = load_scale_data(connection, rows=args.rows, shares=args.shares, dim=args.dim)
        print(f"装载 {data.rows:,} 行 {data.load_seconds:.0f} s（{data.rows / data.load_seconds:,.0f} 行/s，COPY，"
              f"无全文列）；共享 HNSW 建索引 {data.index_seconds:.0f} s；"
              + "，".join(f"{k} {_mb(v)}" for k, v in data.sizes.items()), flush=True)
    queries = query_vectors(args.queries, dim=args.dim)
    lines = ["| 目标库占比（分块） | 做法 | 召回@15 | 召回@100 | p50 (ms) | p95 (ms) | 实际路径 | 备注 |",
             "|---|---|---|---|---|---|---|---|"]

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    truths = {}
    for kb in data.kbs.values():
        big = _chunks(kb) >= settings.ANN_KB_INDEX_MIN_CHUNKS
        truths[kb.id] = measure_kb(kb, _label(kb, data.rows), queries, args.compressions if big else [], emit)
    measure_auto(data, queries, truths, emit, filler=not args.skip_filler)
    print(f"\n结果（{data.rows:,} 行，{args.dim} 维，{args.queries} 个查询；延迟为候选 15 的单次向量检索数据库耗时）")
    print("\n".join(lines))
    if not args.keep:
        drop_scale_data(connection, data)


if __name__ == "__main__":
    main()
