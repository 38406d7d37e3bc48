"""向量阶段的耗时拆解：同一批真实查询向量、同一个知识库，按召回深度分别测数据库内、进程内与检索服务里的耗时。

    .venv/bin/python bench/vector_stage.py --kb bench-load-1795635072                  # 默认深度 15 与 50
    .venv/bin/python bench/vector_stage.py --kb NAME --depths 15 50 100 --queries 200

用来回答“gunicorn 里 vector 阶段比数据库里的执行时间长很多，差在哪里”。对每个深度（每一路要的候选数）：

- 数据库内：``EXPLAIN (ANALYZE)`` 同一条语句（``search.ann.kb_index_statement``），前面是同样的本地设置
  （``search.ann.hnsw_settings_statement``），计划 + 执行时间；
- 进程内：``search.retrieval.vector_search``（含 Python 与一次往返）；
- 进程内、检索服务的次序：线程池里先向量化再查（模型刚用过 CPU）。

最后用 ``services.search``（vector 模式，top_k 5）给出服务实际的 vector 阶段耗时与它用的深度。查询是从库里分块文本
截出的 6~30 字片段（``bench/fulltext_scale.py`` 的 ``_queries``），查询向量由知识库自己的模型实时计算；只读，不改数据。
知识库要有自己的可用索引（``RAG_ANN_KB_INDEX_MIN_CHUNKS`` 以上，定时同步建好），否则只报进程内与服务里的耗时。
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django_setup import setup_django

setup_django(RAG_QUERY_EMBEDDING_CACHE_SIZE="0")

import numpy as np  # noqa: E402
from django.db import connection  # noqa: E402

from bench.fulltext_scale import _percentiles, _queries  # noqa: E402
from documents.models import DocumentChunk  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from search import ann, services  # noqa: E402
from search.query_embeddings import embed_query  # noqa: E402
from search.retrieval import (  # noqa: E402
    SearchFilters,
    SearchPlan,
    _scope_sql,
    search_plan,
    vector_literal,
    vector_search,
)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def database_ms(kb: KnowledgeBase, plan: SearchPlan, vector: np.ndarray, depth: int) -> float:
    """同一条语句在数据库里的计划 + 执行时间（EXPLAIN ANALYZE，本地设置与检索时相同，经同样的管道发出）。"""
    scope, params = _scope_sql(kb, SearchFilters())
    assert plan.index is not None
    sql, args, ef_search = ann.kb_index_statement(kb, plan.index, scope, params, vector_literal(vector), depth,
                                                  plan.estimate)
    with connection.cursor() as cursor, connection.connection.pipeline():
        cursor.execute(*ann.hnsw_settings_statement(ef_search))
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, args)
        report = cursor.fetchone()[0]
    report = report if isinstance(report, list) else json.loads(report)
    return float(report[0]["Planning Time"] + report[0]["Execution Time"])


def _embed(kb: KnowledgeBase, query: str) -> np.ndarray:
    return embed_query(kb.embedding_provider, kb.embedding_model, query)[0]


def measure_depth(kb: KnowledgeBase, plan: SearchPlan, vectors: list[np.ndarray], queries: list[str], depth: int,
                  warmup: int, pool: ThreadPoolExecutor) -> dict[str, list[float]]:
    """一个深度下三种测法的逐查询耗时（ms）。"""
    for vector in vectors[:warmup]:
        vector_search(kb, vector, SearchFilters(), depth, plan=plan)

    def search(vector: np.ndarray) -> float:
        return timed(lambda: vector_search(kb, vector, SearchFilters(), depth, plan=plan))

    def embed_then_search(query: str) -> float:
        return search(_embed(kb, query + "？"))  # 与预先算好的向量不同的文本：模型真实运行一次

    rows = {"进程内 vector_search": [search(v) for v in vectors[warmup:]]}
    if plan.index is not None and plan.index.valid and not plan.exact:
        rows["数据库内 EXPLAIN ANALYZE"] = [database_ms(kb, plan, v, depth) for v in vectors[warmup:]]
    rows["线程池里先向量化再查"] = [pool.submit(embed_then_search, q).result() for q in queries[warmup:]]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kb", required=True, help="知识库名称")
    parser.add_argument("--depths", type=int, nargs="+", default=[15, 50], help="每一路要的候选数")
    parser.add_argument("--queries", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    kb = KnowledgeBase.objects.get(name=args.kb)
    plan = search_plan(kb)
    texts = list(DocumentChunk.objects.filter(knowledge_base=kb).exclude(role="parent")
                 .values_list("chunk_text", flat=True)[:1000])
    queries = _queries(range(len(texts)), args.queries + args.warmup, text_of=lambda i: texts[i])

    vectors = [_embed(kb, q) for q in queries]
    print(f"知识库 {kb.name}：{plan.estimate:,} 个分块，索引 {plan.index}；{args.queries} 个查询（预热 {args.warmup}）")
    with ThreadPoolExecutor(max_workers=1) as pool:
        for depth in args.depths:
            for name, values in measure_depth(kb, plan, vectors, queries, depth, args.warmup, pool).items():
                print(f"  深度 {depth:>3}  {name:<24} {_percentiles(values)}")
    stage = []
    for i, query in enumerate(queries):
        outcome = services.search(kb, services.SearchRequest(query=query, top_k=5, mode="vector", rerank=False,
                                                             filters=SearchFilters()))
        if i >= args.warmup:
            stage.append(outcome.timings_ms["vector"])
    print(f"  services.search（vector 模式，top_k 5，深度 {services.path_depth(5, 'vector')}）的 vector 阶段"
          f" {_percentiles(stage)}")


if __name__ == "__main__":
    main()
