"""知识库自己的图建好之后，插入用多大的 ef_construction：写入速度与后插进来的近邻的召回，交替并排（issue #22 ②）。

    .venv/bin/python bench/ann_insert_ef.py --rows 100000 --late 20000 --values 200 64 --rounds 2 --keep
    .venv/bin/python bench/ann_insert_ef.py --reuse --values 200 64 --rounds 2

数据是校准过的合成向量（``bench/scale_data.py``，不需要 ../shared），装进一个独占整表的知识库。每一轮对每个取值：
把最后 ``--late`` 个分块挪进一个停车用的知识库，按服务的做法建自己的图（``search.ann.kb_index_build``：按
``KB_INDEX_EF_CONSTRUCTION`` 建，再把插入用的值改成这一轮的取值，即 ``RAG_ANN_KB_INDEX_INSERT_EF_CONSTRUCTION``），
再一批 500 个挪回来，量块/s；之后 ``--queries`` 个查询对精确扫描量召回@15 / @50，并单看真近邻里后插进来的那些
找到了几成（最受影响的就是它们）。

挪回来是 ``UPDATE``（知识库 id 变了，每个索引都插一条新的）：只进知识库自己的图（``shared_ann = false``，与服务里
有自己索引的库的写入相同），不走全文触发器（``session_replication_role = replica``；合成数据没有全文列，触发器只会
往 L0 写空行）。所以块/s 量的是堆与索引的插入，比整个存储步骤快，两个取值之间的比才是要看的。
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from django_setup import setup_django

setup_django()

import numpy as np  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402

from bench.scale_data import ScaleData, drop_scale_data, load_scale_data, query_vectors  # noqa: E402
from documents.filters import SearchFilters  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from search import ann  # noqa: E402
from search.retrieval import vector_search  # noqa: E402

PREFIX = "insert-ef"
BATCH = 500
DEPTHS = (15, 50)


@dataclass(frozen=True)
class Round:
    value: int
    build_seconds: float
    chunks_per_second: float
    recall: dict[int, float]
    worst: dict[int, float]
    late_found: dict[int, float]


def _kb() -> tuple[KnowledgeBase, KnowledgeBase]:
    kb = KnowledgeBase.objects.get(name=f"{PREFIX}-100pct")
    park, _ = KnowledgeBase.objects.get_or_create(name=f"{PREFIX}-park", defaults={
        "description": "bench/ann_insert_ef.py", "embedding_dimension": kb.embedding_dimension})
    return kb, park


def _move(ids: list[int], target: KnowledgeBase) -> float:
    """把 ``ids`` 一批 500 个挪进 ``target``（每批一个事务），返回秒数。"""
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        for start in range(0, len(ids), BATCH):
            cursor.execute("UPDATE document_chunks SET knowledge_base_id = %s, shared_ann = false WHERE id = ANY(%s)",
                           [target.id, ids[start:start + BATCH]])
        cursor.execute("RESET session_replication_role")
    return time.perf_counter() - started


def measure(kb: KnowledgeBase, park: KnowledgeBase, value: int, late: list[int], queries: np.ndarray) -> Round:
    ann.kb_index_drop(kb_id=kb.id)
    _move(late, park)
    settings.ANN_KB_INDEX_INSERT_EF_CONSTRUCTION = value
    started = time.perf_counter()
    ann.kb_index_build(kb=kb)
    build = time.perf_counter() - started
    seconds = _move(late, kb)
    late_set, filters = set(late), SearchFilters()
    recall: dict[int, list[float]] = {depth: [] for depth in DEPTHS}
    found = {depth: [0, 0] for depth in DEPTHS}
    for query in queries:
        truth = [hit.chunk_id for hit in vector_search(kb, query, filters, max(DEPTHS), exact=True)[0]]
        for depth in DEPTHS:
            hits, method = vector_search(kb, query, filters, depth, exact=False)
            if not method.startswith("kb_index"):
                raise AssertionError(f"expected the knowledge base's own index, got {method}")
            got, want = {hit.chunk_id for hit in hits}, set(truth[:depth])
            recall[depth].append(len(got & want) / depth)
            found[depth][0] += len(got & want & late_set)
            found[depth][1] += len(want & late_set)
    return Round(value, build, len(late) / seconds, {d: float(np.mean(v)) for d, v in recall.items()},
                 {d: float(np.min(v)) for d, v in recall.items()},
                 {d: found[d][0] / max(found[d][1], 1) for d in DEPTHS})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--late", type=int, default=20_000, help="图建好之后才插进来的分块数")
    parser.add_argument("--values", type=int, nargs="+", default=[200, 64], help="插入用的 ef_construction，交替量")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--reuse", action="store_true", help="复用上次 --keep 留下的数据")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if not args.reuse:
        data = load_scale_data(connection, rows=args.rows, shares=[1.0], prefix=PREFIX)
        print(f"装载 {data.rows:,} 行 {data.load_seconds:.0f} s，共享 HNSW {data.index_seconds:.0f} s", flush=True)
    kb, park = _kb()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE document_chunks SET knowledge_base_id = %s WHERE knowledge_base_id = %s",
                       [kb.id, park.id])  # 上次被打断时停着的分块先回来
        cursor.execute("SELECT id FROM document_chunks WHERE knowledge_base_id = %s ORDER BY id DESC LIMIT %s",
                       [kb.id, args.late])
        late = [int(row[0]) for row in cursor.fetchall()]
    queries = query_vectors(args.queries, dim=kb.embedding_dimension)
    print("| 轮 | 插入用的 ef_construction | 建图 (s) | 块/s | 召回@15（最差） | 召回@50（最差）"
          " | 后插进来的近邻找到 @15 / @50 |")
    print("|---|---|---|---|---|---|---|")
    try:
        for number in range(1, args.rounds + 1):
            for value in args.values:
                r = measure(kb, park, value, late, queries)
                print(f"| {number} | {value} | {r.build_seconds:.0f} | {r.chunks_per_second:,.0f} |"
                      f" {r.recall[15]:.3f}（{r.worst[15]:.2f}） | {r.recall[50]:.3f}（{r.worst[50]:.2f}） |"
                      f" {r.late_found[15]:.3f} / {r.late_found[50]:.3f} |", flush=True)
    finally:
        ann.kb_index_drop(kb_id=kb.id)
        if not args.keep:
            drop_scale_data(connection, ScaleData(rows=0, dim=kb.embedding_dimension, kbs={1.0: kb}, filler=park))


if __name__ == "__main__":
    main()
