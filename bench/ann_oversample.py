"""知识库自己的二值量化索引多取几倍候选才够（``RAG_ANN_BINARY_OVERSAMPLE``）：召回与数据库耗时随过采样倍数、候选数并排测量。

    .venv/bin/python bench/vector_scale.py --rows 100000 --shares 1.0 --compressions binary --keep   # 先装数据
    .venv/bin/python bench/ann_oversample.py --shares 1.0 --depths 15 50 --oversamples 20 10 5

复用 ``bench/vector_scale.py --keep`` 留下的 ``scale-*`` 知识库（校准过的合成向量；目标库要已经有自己的二值量化索引）。
每个候选数（单路 top_k*3=15；融合深度 50）以精确扫描为 ground truth，对每个过采样倍数交替计时（同一批查询、同一个
索引），报告召回与 ``search.retrieval.vector_search`` 的单次数据库耗时。ef_search 由服务的规则定：
``max(search.ann.ef_search_floor(分块数), 2 * 候选数 * 倍数)``。halfvec 索引不再多取候选（列本身存半精度，索引的距离
就是结果的距离），对它只量一遍（倍数一栏记 1）：召回只由 ef_search 定，改 ``RAG_ANN_EF_SEARCH`` 重跑。
"""

from __future__ import annotations

import argparse
import statistics
import time

from django_setup import setup_django

setup_django()

import numpy as np  # noqa: E402
from django.test import override_settings  # noqa: E402

from bench.scale_data import query_vectors  # noqa: E402
from bench.vector_scale import _percentile  # noqa: E402
from documents.filters import SearchFilters  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from search import ann  # noqa: E402
from search.retrieval import search_plan, vector_search  # noqa: E402


def sweep(kb: KnowledgeBase, queries: np.ndarray, depth: int, oversamples: list[int], rounds: int) -> list[str]:
    binary = kb.vector_compression == KnowledgeBase.VectorCompression.BINARY
    if not binary:
        # halfvec / 不压缩的索引不多取候选：只量一遍（召回随 RAG_ANN_EF_SEARCH 变，改它重跑）
        oversamples = [1]
    filters = SearchFilters()
    truth = [{h.chunk_id for h in vector_search(kb, q, filters, depth, exact=True)[0]} for q in queries]
    times: dict[int, list[float]] = {factor: [] for factor in oversamples}
    recalls: dict[int, list[float]] = {factor: [] for factor in oversamples}
    methods: dict[int, set[str]] = {factor: set() for factor in oversamples}
    for round_ in range(rounds):
        # 每轮里各倍数交替跑同一批查询：缓存与机器负载的变化平均摊到每个倍数上
        for factor in oversamples:
            with override_settings(ANN_BINARY_OVERSAMPLE=factor):
                vector_search(kb, queries[0], filters, depth)  # 预热
                for i, query in enumerate(queries):
                    started = time.perf_counter()
                    hits, method = vector_search(kb, query, filters, depth)
                    times[factor].append((time.perf_counter() - started) * 1000)
                    methods[factor].add(method)
                    if round_ == 0:
                        recalls[factor].append(len(truth[i] & {h.chunk_id for h in hits}) / depth)
    lines = []
    index = ann.kb_index_state(kb.id)
    assert index is not None and index.valid, f"{kb.name} 还没有建好自己的索引"
    for factor in oversamples:
        candidates = depth * factor if binary else depth
        with override_settings(ANN_BINARY_OVERSAMPLE=factor):
            ef = ann.kb_index_statement(kb, index, "true", [], "[0]", depth, search_plan(kb).estimate)[2]
        lines.append(f"| {kb.name} | {kb.vector_compression} | {depth} | {factor}（{candidates} 个，ef_search {ef}） |"
                     f" {np.mean(recalls[factor]):.3f} | {min(recalls[factor]):.2f} |"
                     f" {statistics.median(times[factor]):.1f} / {_percentile(times[factor], 0.95):.1f} |"
                     f" {','.join(sorted(methods[factor]))} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", type=float, nargs="+", default=[1.0])
    parser.add_argument("--depths", type=int, nargs="+", default=[15, 50])
    parser.add_argument("--oversamples", type=int, nargs="+", default=[20, 10, 5])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2, help="计时的轮数（召回只算第一轮）")
    args = parser.parse_args()
    queries = query_vectors(args.queries)
    lines = ["| 知识库 | 压缩 | 候选数 | 过采样倍数 | 召回 | 最差的查询 | p50 / p95 (ms) | 路径 |",
             "|---|---|---|---|---|---|---|---|"]
    for share in args.shares:
        kb = KnowledgeBase.objects.get(name=f"scale-{share * 100:g}pct")
        for depth in args.depths:
            for line in sweep(kb, queries, depth, args.oversamples, args.rounds):
                lines.append(line)
                print(line, flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
