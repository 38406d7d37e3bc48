"""知识库自己的图按 200 建好之后，插入改用更小的 ef_construction（``RAG_ANN_KB_INDEX_INSERT_EF_CONSTRUCTION``）：
改的时候只等很短的锁，拿不到下一轮同步再试；图被按调小的值整张重建过（REINDEX、VACUUM FULL、pg_dump 恢复）的，
下一轮同步在旁边按 200 重建。"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from knowledge.models import KnowledgeBase
from search import ann
from tests.search.test_vector_recall import DIM, _bulk_load, _clustered_vectors

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def big_kb(settings: Any) -> Iterator[KnowledgeBase]:
    settings.EXACT_SEARCH_MAX_CHUNKS = 0
    settings.ANN_KB_INDEX_MIN_CHUNKS = 20
    kb = KnowledgeBase.objects.create(name="ann-insert-ef", embedding_dimension=DIM)
    rng = np.random.default_rng(11)
    _bulk_load(kb, _clustered_vectors(rng, 30, rng.normal(size=(4, DIM)).astype(np.float32)), documents=2)
    try:
        yield kb
    finally:
        ann.kb_index_drop(kb_id=kb.id)


def _graph(kb: KnowledgeBase) -> tuple[str, str | None, int]:
    """(插入用的 ef_construction, 索引注释, relfilenode)。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.reloptions, obj_description(c.oid, 'pg_class'), c.relfilenode FROM pg_class c"
                       " WHERE c.relname = %s", [ann.kb_index_name(kb.id)])
        options, comment, node = cursor.fetchone()
    return dict(option.split("=") for option in options)["ef_construction"], comment, node


def test_the_graph_is_built_at_200_then_inserts_use_the_smaller_value(big_kb: KnowledgeBase) -> None:
    assert ann.kb_indexes_sync() == {"built": [str(big_kb.id)], "dropped": []}
    ef, comment, node = _graph(big_kb)
    assert (ef, comment) == ("64", f"ragservice: graph built with ef_construction=200, relfilenode {node}, 30 chunks")
    with CaptureQueriesContext(connection) as captured:
        assert ann.kb_indexes_sync() == {"built": [], "dropped": []}
    assert not any(query["sql"].startswith(("ALTER", "CREATE", "DROP")) for query in captured.captured_queries)


def test_a_graph_rebuilt_at_the_insert_value_is_rebuilt_beside_at_200(big_kb: KnowledgeBase) -> None:
    """REINDEX（VACUUM FULL、pg_dump 恢复同理）按索引当前的 64 重建整张图、换了 relfilenode：注释对不上，重建。"""
    ann.kb_indexes_sync()
    with connection.cursor() as cursor:
        cursor.execute(f"REINDEX INDEX {ann.kb_index_name(big_kb.id)}")
    assert _graph(big_kb)[0] == "64"
    with CaptureQueriesContext(connection) as captured:
        assert ann.kb_indexes_sync() == {"built": [str(big_kb.id)], "dropped": []}
    statements = [query["sql"] for query in captured.captured_queries]
    created = next(i for i, sql in enumerate(statements)
                   if sql.startswith(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {ann.kb_index_rebuild_name(big_kb.id)}")
                   and "ef_construction = 200" in sql)
    assert created < statements.index(f"DROP INDEX CONCURRENTLY IF EXISTS {ann.kb_index_name(big_kb.id)}")
    ef, comment, node = _graph(big_kb)
    assert ef == "64" and comment is not None and comment.endswith(f"relfilenode {node}, 30 chunks")
    assert ann.kb_index_state(big_kb.id) == ann.KbIndex(ann.kb_index_name(big_kb.id), "halfvec", True,
                                                        excludes_pending=True)


def test_a_knowledge_base_grown_by_half_gets_its_graph_rebuilt(big_kb: KnowledgeBase) -> None:
    """按小的值插进来的节点至多占图的三分之一：分块数长到建图时的 1.5 倍以上，下一轮同步在旁边按 200 重建。"""
    ann.kb_indexes_sync()
    rng = np.random.default_rng(12)
    _bulk_load(big_kb, _clustered_vectors(rng, 14, rng.normal(size=(2, DIM)).astype(np.float32)), documents=2)
    assert ann.kb_indexes_sync() == {"built": [], "dropped": []}  # 44 块：不到 45
    _bulk_load(big_kb, _clustered_vectors(rng, 2, rng.normal(size=(1, DIM)).astype(np.float32)), documents=1)
    assert ann.kb_indexes_sync() == {"built": [str(big_kb.id)], "dropped": []}
    ef, comment, node = _graph(big_kb)
    assert ef == "64" and comment == f"ragservice: graph built with ef_construction=200, relfilenode {node}, 46 chunks"


def test_a_busy_index_keeps_200_until_a_later_sync(big_kb: KnowledgeBase, settings: Any) -> None:
    """ALTER INDEX 要索引的排他锁：有事务在用这张表时只等很短的时间，放弃、不建不删，下一轮再试。"""
    ann.kb_indexes_sync()
    settings.ANN_KB_INDEX_INSERT_EF_CONSTRUCTION = 200  # 运维改回 200：图没变，只改回插入用的值
    assert ann.kb_indexes_sync() == {"built": [], "dropped": []}
    assert _graph(big_kb)[0] == "200"

    settings.ANN_KB_INDEX_INSERT_EF_CONSTRUCTION = 64
    other = connection.copy()
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT count(*) FROM document_chunks")  # 规划时在每个索引上拿 AccessShareLock，持到提交
            assert ann.kb_indexes_sync() == {"built": [], "dropped": []}
            assert _graph(big_kb)[0] == "200"
            cursor.execute("COMMIT")
    finally:
        other.close()
    assert ann.kb_indexes_sync() == {"built": [], "dropped": []}
    assert _graph(big_kb)[0] == "64"
