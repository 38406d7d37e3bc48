"""只读副本（RAG_DATABASE_REPLICA_URL）与 Redis 队列配置（RAG_REDIS_URL）。

测试里的“副本”就是测试库本身的第二个连接别名：检索的 SQL 确实走了那个别名，ORM 与迁移不走；
副本地址连不上时检索退回主库、照常返回结果。向量路在线程池里用自己的连接，数据必须真正提交，所以用 transactional_db。
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from documents.filters import SearchFilters
from infra.config import env_redis_url
from infra.metrics import REPLICA_FALLBACKS
from infra.routers import REPLICA, PrimaryReplicaRouter, fetchall_prepared, reset_replica_state, search_connection
from knowledge.models import KnowledgeBase
from search import ann
from search.retrieval import vector_search
from tests.factories import add_documents, ingest_text

pytestmark = pytest.mark.django_db(transaction=True)

NOTE = "# 政务云招标\n\n投标人须具备信息系统集成资质，服务期三年，预算人民币五百万元。\n\n评标采用综合评分法。"


@pytest.fixture
def replica(transactional_db: None, django_db_blocker: Any, monkeypatch: pytest.MonkeyPatch,
            settings: Any) -> Iterator[Callable[..., None]]:
    """登记一个 ``replica`` 连接别名（默认指向测试库本身），测试结束后关闭并移除。

    Django 的测试类在测试期间只许连开始时声明的别名，测试中途登记的 replica 不在其中：
    只对这个别名放行真正的 ensure_connection（pytest-django 保存的原方法），其余别名照旧受限。
    """
    guarded = BaseDatabaseWrapper.ensure_connection
    real = django_db_blocker._real_ensure_connection

    def ensure_connection(self: BaseDatabaseWrapper) -> None:
        (real if self.alias == REPLICA else guarded)(self)

    monkeypatch.setattr(BaseDatabaseWrapper, "ensure_connection", ensure_connection)

    def configure(**overrides: Any) -> None:
        db = {**connections[DEFAULT_DB_ALIAS].settings_dict, **overrides}
        monkeypatch.setitem(connections.settings, REPLICA, db)
        monkeypatch.setitem(settings.DATABASES, REPLICA, db)
        reset_replica_state()

    yield configure
    if REPLICA in settings.DATABASES:
        connections[REPLICA].close()
        del connections[REPLICA]
    reset_replica_state()


def _search(client: Any, kb: KnowledgeBase, query: str) -> Any:
    response = client.post("/search", {"query": query, "knowledge_base_id": str(kb.id)}, format="json")
    assert response.status_code == 200, response.content
    return response


@contextmanager
def _statements(alias: str) -> Iterator[list[str]]:
    """这个连接别名上执行的语句（带参数的文字）。按连接上的 execute_wrapper 记：预备语句（``fetchall_prepared``）
    不经 Django 的调试游标，CaptureQueriesContext 看不到它们。"""
    seen: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(f"{sql} {params!r}")
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(record):
        yield seen


def _chunk_reads(statements: list[str]) -> int:
    return sum("document_chunks" in sql for sql in statements)


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_without_replica_search_uses_primary() -> None:
    assert REPLICA not in connections.settings
    assert search_connection().alias == DEFAULT_DB_ALIAS


def test_router_keeps_orm_and_migrations_on_primary() -> None:
    router = PrimaryReplicaRouter()
    assert router.db_for_read(KnowledgeBase) == DEFAULT_DB_ALIAS
    assert router.db_for_write(KnowledgeBase) == DEFAULT_DB_ALIAS
    assert router.allow_migrate(DEFAULT_DB_ALIAS, "documents") is True
    assert router.allow_migrate(REPLICA, "documents") is False


def test_search_reads_go_to_the_replica(client_rw: Any, kb_factory: Any, fake_embedder: Any,
                                        replica: Callable[..., None]) -> None:
    kb = kb_factory()
    ingest_text(client_rw, kb, "cloud.md", NOTE)
    replica()
    assert search_connection().alias == REPLICA
    with _statements(REPLICA) as on_replica, _statements(DEFAULT_DB_ALIAS) as on_primary:
        response = _search(client_rw, kb, "投标人资质")
    assert response.json()[0]["filename"] == "cloud.md"
    # 本线程里的检索计划、全文一路、读分块详情都在副本上；主库只剩鉴权、限流与知识库查找
    assert _chunk_reads(on_replica) >= 2, on_replica
    assert on_primary and _chunk_reads(on_primary) == 0, on_primary


def test_vector_index_state_is_read_where_the_vector_query_runs(kb_factory: Any,
                                                                replica: Callable[..., None]) -> None:
    """向量路先查系统目录看知识库自己的索引是否可用，再按结果选查询方式：两步都必须在副本上（主库上建好的索引，
    副本回放落后时可能还没有）。建、删索引看主库。"""
    kb = kb_factory(embedding_dimension=384)
    add_documents(kb, documents=1, chunks_per_document=3)
    replica()
    with _statements(REPLICA) as on_replica, _statements(DEFAULT_DB_ALIAS) as on_primary:
        hits, method = vector_search(kb, np.ones(384, dtype=np.float32), SearchFilters(), 2, exact=False)
        assert ann.kb_index_state(kb.id) is None
    assert (len(hits), method) == (2, "hnsw")
    catalog = [sql for sql in on_replica if "pg_index" in sql]
    assert len(catalog) == 1 and ann.kb_index_name(kb.id) in catalog[0], catalog
    # 主库上只有显式不带连接的那一次（建、删索引的路径）
    assert sum("pg_index" in sql for sql in on_primary) == 1


def test_unreachable_replica_falls_back_to_primary(client_rw: Any, kb_factory: Any, fake_embedder: Any,
                                                   replica: Callable[..., None], settings: Any) -> None:
    kb = kb_factory()
    ingest_text(client_rw, kb, "cloud.md", NOTE)
    settings.REPLICA_RETRY_SECONDS = 60
    replica(HOST="127.0.0.1", PORT=str(_unused_port()), OPTIONS={"connect_timeout": "1"})
    before = REPLICA_FALLBACKS._value.get()
    assert search_connection().alias == DEFAULT_DB_ALIAS
    assert REPLICA_FALLBACKS._value.get() == before + 1
    # 重试窗口内直接用主库，不再每次等连接超时
    response = _search(client_rw, kb, "投标人资质")
    assert response.json()[0]["filename"] == "cloud.md"
    assert not response.get("X-Search-Degraded")
    assert REPLICA_FALLBACKS._value.get() == before + 1


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://cache:6380/1", "unix:///run/redis.sock", ""])
def test_redis_url_accepts_redis_schemes(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("RAG_REDIS_URL", url)
    assert env_redis_url() == url


def test_redis_url_with_wrong_scheme_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_REDIS_URL", "http://127.0.0.1:6379")
    with pytest.raises(ImproperlyConfigured, match="RAG_REDIS_URL"):
        env_redis_url()


def test_fetchall_prepared_prepares_returns_raw_bytes_and_raises_django_errors() -> None:
    """全文一路的热语句：预备一次、之后复用（pg_prepared_statements 里有它），经过连接上的 execute_wrapper；
    二进制结果里 bytea 原样回来（不经十六进制）；SQL 出错时是 Django 的数据库异常（调用方只认它）。"""
    conn = connections[DEFAULT_DB_ALIAS]
    sql = "SELECT %s::bytea, %s::int[], %s::text[]"
    seen: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with conn.execute_wrapper(wrapper):
        for _ in range(2):
            rows = fetchall_prepared(conn, sql, [b"\x00\xff\x7f", [1, 2], ["肝", "a"]], binary=True)
            assert rows == [(b"\x00\xff\x7f", [1, 2], ["肝", "a"])]
    assert seen == [sql, sql]
    with conn.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement = %s",
                       ["SELECT $1::bytea, $2::int[], $3::text[]"])
        assert cursor.fetchone() == (1,)
    assert fetchall_prepared(conn, "SELECT %s::int + 1", [41]) == [(42,)]
    with pytest.raises(DatabaseError):
        fetchall_prepared(conn, "SELECT no_such_column FROM fulltext_blocks", [])
