"""向量路在知识库只占全表一小部分时仍然召回完整：占 1%（精确扫描）与占 10%（知识库自己的 HNSW 索引）。

HNSW 索引是全表共享的（按维度的部分索引），只按知识库过滤时，普通的 HNSW 扫描先取 ef_search 个最近邻
再过滤，1% 的选择率下几乎什么都剩不下。这里比较两种做法与精确扫描（ground truth）：

- 小知识库自动走精确扫描（b-tree 圈出本库的行后逐一算距离）：召回必须是 1.0（≥ 0.95 的要求），候选数拿满；
- 强制走 HNSW + pgvector 0.8 迭代扫描（strict_order）：每次都拿满候选数——迭代扫描在
  RAG_HNSW_MAX_SCAN_TUPLES 内凑不够时退回精确扫描（"hnsw+exact"）；召回打印出来作参考。
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from bench.scale_data import load_scale_data, query_vectors
from documents.filters import SearchFilters
from documents.models import Document, DocumentChunk, hnsw_index
from knowledge.models import KnowledgeBase
from ops.tasks import sync_vector_indexes
from search import ann
from search.retrieval import vector_search

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


def _executed_plan(search: Callable[[], object]) -> str:
    """跑一次检索，在同一种会话设置下（重放它执行的 set_config）EXPLAIN 它的向量查询，返回计划文本。"""
    with CaptureQueriesContext(connection) as captured:
        search()
    statements = [q["sql"] for q in captured.captured_queries]
    statement = next(sql for sql in statements if "<=>" in sql)
    with transaction.atomic(), connection.cursor() as cursor:
        for sql in statements:
            if "set_config(" in sql:
                cursor.execute(sql)
        cursor.execute("EXPLAIN " + statement)
        return "\n".join(row[0] for row in cursor.fetchall())


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
        plan = _executed_plan(lambda exact=exact: vector_search(target, queries[0], filters, 15, exact=exact))
        assert (f"document_chunks_hnsw_{DIM}" in plan) is uses_hnsw, plan


def test_ten_percent_knowledge_base_uses_its_own_index_with_full_recall(settings: Any) -> None:
    """“≥ 10 万分块、占全表 10% 的知识库”的缩小版：3 万行的表里占 10% 的 3,000 个分块（校准过的 e5 式向量）。

    阈值按同样比例缩小，让这个知识库走大知识库的路径：自己的部分 HNSW 索引。候选数拿满、召回 ≥ 0.95
    （1M 规模的实测与共享索引迭代扫描的对照见 bench/README.md）。
    """
    data = load_scale_data(connection, rows=30_000, shares=(0.10,), prefix="recall", progress=lambda _: None)
    target = data.kbs[0.10]
    settings.EXACT_SEARCH_MAX_CHUNKS = settings.ANN_KB_INDEX_MIN_CHUNKS = 1000
    filters = SearchFilters()
    queries = query_vectors(30)
    truth = {limit: [{h.chunk_id for h in vector_search(target, q, filters, limit, exact=True)[0]} for q in queries]
             for limit in (15, 100)}

    def recall(limit: int) -> float:
        found = []
        for query, expected in zip(queries, truth[limit], strict=True):
            hits, method = vector_search(target, query, filters, limit)
            assert len(hits) == limit, f"{method}: only {len(hits)} of {limit} candidates"
            found.append(len(expected & {h.chunk_id for h in hits}) / limit)
        return float(np.mean(found))

    with connection.cursor() as cursor:
        # 测试事务里不能 CONCURRENTLY；定时任务走的 CONCURRENTLY 路径见下一个测试
        cursor.execute(ann.kb_index_sql(target, concurrently=False))
    own = {limit: recall(limit) for limit in (15, 100)}
    print("recall of a 10% knowledge base through its own index:", own)
    assert vector_search(target, queries[0], filters, 15)[1] == "kb_index:halfvec"  # 默认的压缩方式
    assert min(own.values()) >= 0.95, own

    # 服务执行的那条 SQL（连同它的会话设置）走这个知识库自己的索引（谓词与查询条件匹配），而不是共享索引，
    # 也不是“b-tree + 排序”：3,000 行时规划器本会觉得排序更便宜，5 万行时行数估计漂移后也会（search.ann._run）
    assert ann.kb_index_name(target.id) in _executed_plan(lambda: vector_search(target, queries[0], filters, 15))


@pytest.mark.django_db(transaction=True)
def test_kb_indexes_sync_builds_rebuilds_and_drops(settings: Any) -> None:
    """定时任务的完整生命周期（真实的 CREATE/DROP INDEX CONCURRENTLY）：越过阈值建索引，改压缩方式重建，
    halfvec 索引的距离就是堆里存的距离、二值量化的候选经精确重排，结果都与精确扫描一致，知识库删除后索引删掉。"""
    settings.EXACT_SEARCH_MAX_CHUNKS = 0
    settings.ANN_KB_INDEX_MIN_CHUNKS = 50
    rng = np.random.default_rng(3)
    centers = rng.normal(size=(8, DIM)).astype(np.float32)
    kb = KnowledgeBase.objects.create(name=f"ann-{uuid.uuid4().hex[:6]}", embedding_dimension=DIM)
    small = KnowledgeBase.objects.create(name=f"ann-small-{uuid.uuid4().hex[:6]}", embedding_dimension=DIM)
    _bulk_load(kb, _clustered_vectors(rng, 60, centers), documents=2)
    _bulk_load(small, _clustered_vectors(rng, 10, centers), documents=1)
    query = _clustered_vectors(rng, 1, centers)[0]
    filters = SearchFilters()
    try:
        assert vector_search(kb, query, filters, 15)[1] == "hnsw"  # 索引建好之前走共享索引
        assert sync_vector_indexes() is None
        state = ann.kb_index_state(kb.id)
        assert state == ann.KbIndex(ann.kb_index_name(kb.id), "halfvec", True, excludes_pending=True)  # 默认的压缩方式
        assert ann.kb_index_state(small.id) is None  # 不到阈值的不建
        assert ann.kb_indexes_sync() == {"built": [], "dropped": []}  # 幂等
        truth, _ = vector_search(kb, query, filters, 15, exact=True)
        for compression in ("halfvec", "binary", "none"):
            if compression != kb.vector_compression:
                kb.vector_compression = compression
                kb.save(update_fields=["vector_compression"])
                assert ann.kb_indexes_sync() == {"built": [str(kb.id)], "dropped": []}
            hits, method = vector_search(kb, query, filters, 15)
            assert method == ("kb_index" if compression == "none" else f"kb_index:{compression}")
            # halfvec 的索引距离与精确扫描同一个值；二值量化的候选里含精确的前 15 个时重排后相同
            if compression != "none":
                assert hits == truth
        kb.status = KnowledgeBase.Status.DELETED
        kb.save(update_fields=["status"])
        assert ann.kb_indexes_sync() == {"built": [], "dropped": [str(kb.id)]}
        assert ann.kb_index_state(kb.id) is None
    finally:
        ann.kb_index_drop(kb_id=kb.id)


def test_ef_search_floor_grows_with_the_knowledge_base(settings: Any) -> None:
    # 10 万块以内是 RAG_ANN_EF_SEARCH；100 万块的图上 200 会让个别查询一个近邻都找不到，所以每大 10 倍多一倍
    settings.ANN_EF_SEARCH = 200
    assert [ann.ef_search_floor(n) for n in (0, 20_000, 100_000, 1_000_000, 10_000_000)] == [200, 200, 200, 400, 600]
    assert ann.ef_search_floor(10**12) == 1000  # pgvector 的上限
    settings.ANN_EF_SEARCH = 50
    assert ann.ef_search_floor(1_000_000) == 100


def test_kb_index_statement_takes_the_larger_of_floor_and_four_times_the_limit(settings: Any) -> None:
    settings.ANN_EF_SEARCH = 200
    kb = KnowledgeBase(id=uuid.uuid4(), name="ef", embedding_dimension=384)
    index = ann.KbIndex(name=ann.kb_index_name(kb.id), compression="halfvec", valid=True)

    def ef(limit: int, chunks: int) -> int:
        return ann.kb_index_statement(kb, index, "true", [], "[0]", limit, chunks)[2]

    # 列存半精度：halfvec 索引的距离就是结果的距离，不再多取候选、重排；二值量化仍按汉明距离多取再重排
    assert "WITH" not in ann.kb_index_statement(kb, index, "true", [], "[0]", 15, 100_000)[0]
    binary = ann.KbIndex(name=index.name, compression="binary", valid=True, center="'[0]'")
    assert "WITH candidates" in ann.kb_index_statement(kb, binary, "true", [], "[0]", 15, 100_000)[0]

    assert ef(15, 100_000) == 200  # 30 个候选：下限说了算
    assert ef(15, 1_000_000) == 400
    assert ef(100, 100_000) == 400  # 四倍深度说了算：与以前多取 2 倍、ef_search 取候选两倍时相同
