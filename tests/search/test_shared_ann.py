"""知识库有了自己的 HNSW 索引之后写进来的分块不进共享索引（``DocumentChunk.shared_ann``），检索照样找得到它们：
有自己的索引时走它，没有时精确扫描；迁移 documents.0014 换共享索引的部分条件，中途被杀可以重跑。"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from documents.filters import SearchFilters
from documents.models import Document, DocumentChunk
from knowledge.models import KnowledgeBase
from search import ann
from search.retrieval import search_plan, vector_search
from tests.documents.test_api import BID_TEXT, upload
from tests.search.test_vector_recall import DIM, _bulk_load, _clustered_vectors

pytestmark = pytest.mark.django_db

SECOND_TEXT = "# 售后服务\n\n中标人须提供五年免费维保，接到故障通知后两小时内响应、二十四小时内到场修复。\n"


def _stored_vector(chunk: DocumentChunk) -> np.ndarray:
    with connection.cursor() as cursor:
        cursor.execute("SELECT embedding::text FROM document_chunks WHERE id = %s", [chunk.id])
        return np.array(cursor.fetchone()[0].strip("[]").split(","), dtype=np.float32)


def test_chunks_stored_after_the_own_index_skip_the_shared_index(settings, client_rw, kb_factory, run_on_commit,
                                                                 fake_embedder):
    settings.EXACT_SEARCH_MAX_CHUNKS = 0  # 小库也按大知识库的路径走
    kb = kb_factory()
    first = upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    assert not DocumentChunk.objects.filter(document_id=first, shared_ann=False).exists()
    plan = search_plan(kb)
    assert (plan.index, plan.detached, plan.exact) == (None, False, False)

    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # 外键检查先做完，否则不能在同一事务里建索引
        cursor.execute(ann.kb_index_sql(kb, concurrently=False))  # 测试事务里建；定时任务走 CONCURRENTLY
    second = upload(client_rw, kb, "b.md", SECOND_TEXT.encode(), run_on_commit).json()["document_id"]
    assert Document.objects.get(pk=second).status == Document.Status.COMPLETED
    # 第一份文档的分块留在共享索引里（不回头改已有的行），第二份的只进知识库自己的索引
    assert not DocumentChunk.objects.filter(document_id=first, shared_ann=False).exists()
    assert not DocumentChunk.objects.filter(document_id=second, shared_ann=True).exists()
    plan = search_plan(kb)
    assert plan.detached and plan.index is not None and plan.index.valid and not plan.exact

    target = DocumentChunk.objects.filter(document_id=second).first()
    assert target is not None
    query, filters = _stored_vector(target), SearchFilters()
    hits, method = vector_search(kb, query, filters, 1)
    assert (method, hits[0].chunk_id) == ("kb_index:halfvec", target.id)

    # 自己的索引没了（缩小后删掉、手工删掉）：共享索引找不到第二份文档，检索改走精确扫描
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {ann.kb_index_name(kb.id)}")
    plan = search_plan(kb)
    assert plan.index is None and plan.detached and plan.exact
    hits, method = vector_search(kb, query, filters, 1)
    assert (method, hits[0].chunk_id) == ("exact", target.id)
    forced, method = vector_search(kb, query, filters, 1, exact=False)
    assert method == "hnsw" and target.id not in {hit.chunk_id for hit in forced}


@pytest.mark.django_db(transaction=True)
def test_a_compression_change_builds_the_new_graph_beside_the_old(settings: Any) -> None:
    """改压缩方式：新图建好之前旧图一直在（检索照旧走它），建好才删旧图、改名；上次换图被打断留下的新图先删掉。"""
    settings.EXACT_SEARCH_MAX_CHUNKS = 0
    settings.ANN_KB_INDEX_MIN_CHUNKS = 20
    kb = KnowledgeBase.objects.create(name="ann-swap", embedding_dimension=DIM,
                                      vector_compression=KnowledgeBase.VectorCompression.NONE)
    rng = np.random.default_rng(5)
    _bulk_load(kb, _clustered_vectors(rng, 30, rng.normal(size=(4, DIM)).astype(np.float32)), documents=2)
    name, rebuild = ann.kb_index_name(kb.id), ann.kb_index_rebuild_name(kb.id)
    try:
        assert ann.kb_indexes_sync() == {"built": [str(kb.id)], "dropped": []}
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE INDEX {rebuild} ON document_chunks (id) WHERE false")  # 被打断的那次留下的
        assert ann.kb_indexes_sync() == {"built": [], "dropped": []}  # 要留的知识库：残留交给下一次建图
        kb.vector_compression = KnowledgeBase.VectorCompression.HALFVEC
        kb.save(update_fields=["vector_compression"])
        with CaptureQueriesContext(connection) as captured:
            assert ann.kb_indexes_sync() == {"built": [str(kb.id)], "dropped": []}
        statements = [query["sql"] for query in captured.captured_queries]
        created = next(i for i, sql in enumerate(statements) if sql.startswith(f"CREATE INDEX CONCURRENTLY IF NOT"
                                                                                   f" EXISTS {rebuild} "))
        assert created < statements.index(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        assert ann.kb_index_state(kb.id) == ann.KbIndex(name, "halfvec", True, excludes_pending=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_class WHERE relname = %s", [rebuild])
            assert cursor.fetchone()[0] == 0
        kb.status = KnowledgeBase.Status.DELETED
        kb.save(update_fields=["status"])
        assert ann.kb_indexes_sync() == {"built": [], "dropped": [str(kb.id)]}
    finally:
        ann.kb_index_drop(kb_id=kb.id)


def _shared_indexes() -> dict[str, tuple[str, bool]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname, pg_get_indexdef(c.oid), i.indisvalid FROM pg_class c"
                       " JOIN pg_index i ON i.indexrelid = c.oid WHERE c.relname LIKE 'document\\_chunks\\_hnsw\\_%'")
        return {name: (definition, valid) for name, definition, valid in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_migration_swaps_the_shared_indexes_and_resumes_after_a_kill() -> None:
    migration: Any = importlib.import_module("documents.migrations.0014_chunk_shared_ann")
    names = {f"document_chunks_hnsw_{dim}" for dim in migration.DIMENSIONS}
    editor = connection.schema_editor(atomic=False)
    try:
        assert set(_shared_indexes()) == names
        assert all("shared_ann" in definition and valid for definition, valid in _shared_indexes().values())
        migration.backwards(None, editor)
        assert set(_shared_indexes()) == names
        assert not any("shared_ann" in definition for definition, _ in _shared_indexes().values())

        # 被杀在“新索引建好、旧索引已删、还没改名”：重跑只改名；被杀在建临时索引途中（留下无效索引）：删掉重建
        with connection.cursor() as cursor:
            cursor.execute("CREATE INDEX document_chunks_hnsw_384_rebuild ON document_chunks USING hnsw"
                           " ((embedding::vector(384)) vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
                           " WHERE embedding_dim = 384 AND shared_ann")
            cursor.execute("DROP INDEX document_chunks_hnsw_384")
            # CONCURRENTLY 建唯一索引遇到重复值失败，留下一个无效索引（与建到一半被杀相同）
            cursor.execute("CREATE TABLE shared_ann_probe AS SELECT 1 AS x FROM generate_series(1, 2)")
            with pytest.raises(IntegrityError):
                cursor.execute("CREATE UNIQUE INDEX CONCURRENTLY document_chunks_hnsw_768_rebuild"
                               " ON shared_ann_probe (x)")
        migration.forwards(None, editor)
        indexes = _shared_indexes()
        assert set(indexes) == names
        assert all("shared_ann" in definition and "hnsw" in definition and valid
                   for definition, valid in indexes.values()), indexes
        migration.forwards(None, editor)  # 已经换好：什么也不做
        assert _shared_indexes() == indexes
    finally:
        migration.forwards(None, editor)
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS shared_ann_probe")
