"""向量路在“知识库只占全表 1%”时仍然召回完整：≥ 50k 个分块，其中 1% 属于被检索的知识库。

HNSW 索引是全表共享的（按维度的部分索引），只按知识库过滤时，普通的 HNSW 扫描先取 ef_search 个最近邻
再过滤，1% 的选择率下几乎什么都剩不下。这里比较两种做法与精确扫描（ground truth）：

- 小知识库自动走精确扫描（b-tree 圈出本库的行后逐一算距离）：召回必须是 1.0（≥ 0.95 的要求），候选数拿满；
- 强制走 HNSW + pgvector 0.8 迭代扫描（strict_order）：每次都拿满候选数——迭代扫描在
  RAG_HNSW_MAX_SCAN_TUPLES 内凑不够时退回精确扫描（"hnsw+exact"）；召回打印出来作参考。
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from documents.models import Document, DocumentChunk, hnsw_index
from knowledge.models import KnowledgeBase
from search.retrieval import SearchFilters, vector_search

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

TOTAL_CHUNKS = 50_000
SHARE = 0.01
DIM = 384


def _clustered_vectors(rng: np.random.Generator, count: int, centers: np.ndarray) -> np.ndarray:
    """高斯混合：真实 embedding 成簇分布，比各向同性随机向量更接近实际。"""
    picks = rng.integers(0, len(centers), size=count)
    vectors = centers[picks] + rng.normal(scale=0.35, size=(count, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _bulk_load(kb: KnowledgeBase, vectors: np.ndarray, documents: int) -> None:
    docs = Document.objects.bulk_create(
        Document(knowledge_base=kb, filename=f"{kb.name}-{i}.txt", status=Document.Status.COMPLETED,
                 chunk_count=len(vectors) // documents)
        for i in range(documents)
    )
    with connection.cursor() as cursor, cursor.cursor.copy(
        "COPY document_chunks (knowledge_base_id, document_id, chunk_index, chunk_text, metadata, embedding,"
        " embedding_dim, role, token_count, text_hash, created_at) FROM STDIN"
    ) as copy:
        for index, vector in enumerate(vectors):
            literal = "[" + ",".join(f"{x:.6f}" for x in vector.tolist()) + "]"
            copy.write_row((kb.id, docs[index % documents].id, index, f"chunk {index}", "{}", literal, DIM,
                            "chunk", 1, "", "2026-01-01T00:00:00Z"))


def test_one_percent_knowledge_base_keeps_full_recall(settings: object) -> None:
    rng = np.random.default_rng(7)
    centers = rng.normal(size=(64, DIM)).astype(np.float32)
    target_size = int(TOTAL_CHUNKS * SHARE)
    target = KnowledgeBase.objects.create(name=f"target-{uuid.uuid4().hex[:6]}", embedding_dimension=DIM)
    others = KnowledgeBase.objects.create(name=f"others-{uuid.uuid4().hex[:6]}", embedding_dimension=DIM)
    # 先删索引、装完数据再建（在测试事务里，结束时回滚）：批量建索引比逐行插入维护快得多
    hnsw = hnsw_index(DIM)
    with connection.schema_editor() as editor:
        editor.remove_index(DocumentChunk, hnsw)
        _bulk_load(others, _clustered_vectors(rng, TOTAL_CHUNKS - target_size, centers), documents=100)
        _bulk_load(target, _clustered_vectors(rng, target_size, centers), documents=5)
        editor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # 外键检查先做完，否则不能在同一事务里建索引
        editor.add_index(DocumentChunk, hnsw)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE document_chunks")
    queries = _clustered_vectors(rng, 30, centers)

    filters = SearchFilters()
    recalls: dict[tuple[str, int], list[float]] = {}
    fallbacks: dict[str, int] = {}
    for limit in (15, 100):  # top_k=5 的候选数，与候选上限
        for query in queries:
            truth, method = vector_search(target, query, filters, limit, exact=True)
            assert method == "exact" and len(truth) == limit
            truth_ids = {hit.chunk_id for hit in truth}
            for name in ("auto", "hnsw-forced"):
                with transaction.atomic(), connection.cursor() as cursor:
                    if name == "hnsw-forced":
                        # 1% 的库规划器自己会选 b-tree + 排序（精确）；关掉排序逼它走 HNSW 迭代扫描来测召回
                        cursor.execute("SET LOCAL enable_sort = off")
                    hits, method = vector_search(target, query, filters, limit,
                                                 exact=None if name == "auto" else False)
                assert method in (("exact",) if name == "auto" else ("hnsw", "hnsw+exact"))
                assert len(hits) == limit, f"{name}: only {len(hits)} of {limit} candidates"
                fallbacks[name] = fallbacks.get(name, 0) + (method == "hnsw+exact")
                distances = [hit.value for hit in hits]
                assert distances == sorted(distances)
                recalls.setdefault((name, limit), []).append(len(truth_ids & {h.chunk_id for h in hits}) / limit)
    summary = {key: float(np.mean(values)) for key, values in recalls.items()}
    print("vector recall vs exact:", summary, "exact fallbacks:", fallbacks)
    # 选定的做法（小知识库自动精确扫描）召回 100%；强制 HNSW 迭代扫描也总能拿满候选，但 1% 选择率下
    # 召回只有 0.8~0.95（随 ef_search 上升，实测见 bench/README.md），这正是小知识库不走 HNSW 的原因
    assert summary[("auto", 15)] == 1.0 and summary[("auto", 100)] == 1.0, summary

    # 逼出来的那条 SQL 确实走本维度的部分 HNSW 索引；精确扫描则不走
    for exact, uses_hnsw in ((False, True), (True, False)):
        with CaptureQueriesContext(connection) as captured:
            vector_search(target, queries[0], filters, 15, exact=exact)
        statement = next(q["sql"] for q in captured.captured_queries if "<=>" in q["sql"])
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute("SET LOCAL hnsw.iterative_scan = strict_order")
            cursor.execute("EXPLAIN " + statement)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert (f"document_chunks_hnsw_{DIM}" in plan) is uses_hnsw, plan
