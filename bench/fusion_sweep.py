"""融合参数的离线扫描：对一个已摄取的评测知识库，每个问题只跑一次两路召回（深度 100），
再在内存里对每路深度、全文权重（固定部分 + 随最佳匹配程度增加的部分）
与覆盖率闸门做网格搜索，报告 nDCG@10 / Recall@10 / hit@5。

    .venv/bin/python bench/fusion_sweep.py ../shared/data/toyhom_meddialog --kb eval-toyhom-… [--level passage]

与 ``manage.py evaluate`` 的 hybrid 方式同一套召回与指标代码，只是融合在这里重算，几秒钟就能比较上百组参数。
查询向量走评测缓存（``evaluate --cache-query-embeddings`` 之后不再计算）。只用于开发集；默认值的取舍写在
docs/EVALUATION.md。
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")
os.environ.setdefault("RAG_LOG_LEVEL", "warning")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from documents.filters import SearchFilters  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from raglib.analysis import parse_query  # noqa: E402
from raglib.evaluation.dataset import load_dataset  # noqa: E402
from raglib.evaluation.metrics import answer_hit_at_k, dedupe, ndcg_at_k, recall_at_k  # noqa: E402
from raglib.fusion import lexical_gate, rrf_fuse  # noqa: E402
from raglib.scoring import match_ratio  # noqa: E402
from search.evaluation.embedding_cache import embedding_cache  # noqa: E402
from search.query_embeddings import embed_query  # noqa: E402
from search.retrieval import fulltext_search, load_chunks, vector_search  # noqa: E402

DEPTH = 100


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--kb", required=True)
    parser.add_argument("--level", default="passage")
    parser.add_argument("--queries", type=Path)
    args = parser.parse_args()
    dataset = load_dataset(args.dataset, args.level, queries=args.queries)
    kb = KnowledgeBase.objects.get(name=args.kb)
    runs = []
    with embedding_cache(kb.embedding_provider, kb.embedding_model, queries=True):
        for query in dataset.queries:
            vector, _ = embed_query(kb.embedding_provider, kb.embedding_model, query.text)
            v_hits, _ = vector_search(kb, vector, SearchFilters(), DEPTH)
            parsed = parse_query(query.text, analyzer=settings.FULLTEXT_ANALYZER)
            found = fulltext_search(kb, parsed, SearchFilters(), DEPTH)
            top = match_ratio(found.hits[0].value, found.scale) if found.hits else 0.0
            runs.append((query, [h.chunk_id for h in v_hits], [h.chunk_id for h in found.hits], found.coverage, top))
    ids = {c for _, v, t, _, _ in runs for c in (*v, *t)}
    chunks = load_chunks(sorted(ids))
    unit = {c: str(row.metadata.get("eval_id", "")) for c, row in chunks.items()}
    text = {c: row.text for c, row in chunks.items()}

    def score(rankings: list[tuple[object, list[int]]]) -> tuple[float, float, float]:
        ndcg = rec = hit = 0.0
        for (query, *_), ranked_chunks in rankings:
            ranked = dedupe(unit[c] for c in ranked_chunks)
            qrels = dataset.qrels[query.id]
            ndcg += ndcg_at_k(ranked, qrels, 10)
            rec += recall_at_k(ranked, qrels, 10)
            hit += answer_hit_at_k([text[c] for c in ranked_chunks], query.answers, 5)
        n = len(rankings)
        return ndcg / n, rec / n, hit / n

    print("vector   ", "{:.4f} {:.4f} {:.4f}".format(*score([(r, r[1]) for r in runs])))
    print("fulltext ", "{:.4f} {:.4f} {:.4f}".format(*score([(r, r[2]) for r in runs])))
    # 全文权重 = (base + slope·最佳匹配程度) 乘以覆盖率闸门；slope=0 即固定权重
    grid = itertools.product((60,), (50, 100), (0.5, 0.7, 1.0), (0.0, 1.0, 2.0), ((0.0, 0.0), (0.3, 0.6)))
    for k, depth, base, slope, (floor, full) in grid:
        fused = []
        for run in runs:
            gate = lexical_gate(run[3], floor, full) if full > 0 else 1.0
            ranking = rrf_fuse({"vector": run[1][:depth], "fulltext": run[2][:depth]}, k=k,
                               weights={"vector": 1.0, "fulltext": (base + slope * run[4]) * gate})
            fused.append((run, [f.key for f in ranking][:DEPTH]))
        print(f"k={k:<3} depth={depth:<3} base={base:<4} slope={slope:<4} gate=({floor},{full})",
              "{:.4f} {:.4f} {:.4f}".format(*score(fused)))


if __name__ == "__main__":
    main()
