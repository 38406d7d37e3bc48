"""API key 鉴权：Bearer 头校验、密钥只存摘要、作用域与读写权限、校验顺序、管理命令与生产模式守卫。

校验顺序见 docs/INVARIANTS.md 的 ERROR-ORDER：存在性（404）→ 可用性（409 等）→ 权限（403）。
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from knowledge.models import CleanupTask, KnowledgeBase
from ops.auth import principal_for_key
from ops.models import ApiKey
from tests import workers
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db

WWW_AUTHENTICATE = 'Bearer realm="ragservice"'


def _failed_task(kb: KnowledgeBase) -> CleanupTask:
    """造一个已删除知识库上的失败清理任务（可人工重试）。"""
    kb.status = KnowledgeBase.Status.DELETED
    kb.save(update_fields=["status"])
    return CleanupTask.objects.create(knowledge_base=kb, status=CleanupTask.Status.FAILED, error_message="boom")


# ---------------------------------------------------------------- 认证失败：401 + 统一错误格式


def test_missing_authorization_is_401_with_challenge(db):
    response = APIClient().get("/knowledge_bases")
    assert_error(response, 401, "UNAUTHORIZED")
    assert response["WWW-Authenticate"] == WWW_AUTHENTICATE


@pytest.mark.parametrize("header", ["Token abc", "Bearer", "Bearer    ", "Basic dXNlcjpwYXNz", "abc"])
def test_malformed_authorization_header_is_401(db, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/knowledge_bases")
    assert_error(response, 401, "UNAUTHORIZED")
    assert response["WWW-Authenticate"] == WWW_AUTHENTICATE


def test_unknown_key_is_401(make_client):
    make_client()  # 库里存在别的 key，也不能被随便猜中
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer rag_definitely-not-a-real-key")
    response = client.get("/knowledge_bases")
    assert_error(response, 401, "UNAUTHORIZED")
    assert response["WWW-Authenticate"] == WWW_AUTHENTICATE


def test_revoked_key_is_401(make_client):
    client = make_client(active=False)
    assert_error(client.get("/knowledge_bases"), 401, "UNAUTHORIZED")


def test_key_revoked_after_use_stops_working(make_client):
    client = make_client()
    assert client.get("/knowledge_bases").status_code == 200
    ApiKey.objects.update(is_active=False)
    assert_error(client.get("/knowledge_bases"), 401, "UNAUTHORIZED")


def test_bearer_scheme_is_case_insensitive(client_rw):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"bearer {client_rw.raw_key}")
    assert client.get("/knowledge_bases").status_code == 200


# ---------------------------------------------------------------- 密钥存储


def test_key_is_stored_only_as_sha256_hash(client_rw):
    raw = client_rw.raw_key
    key = ApiKey.objects.get()
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert key.key_prefix == raw[:10]
    # 整行（含所有列）序列化后都不包含明文
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT row_to_json(k)::text FROM {ApiKey._meta.db_table} k")
        rows = [r[0] for r in cursor.fetchall()]
    assert len(rows) == 1
    assert raw not in rows[0]
    assert raw[10:] not in rows[0]


def test_last_used_at_is_recorded(client_rw):
    assert ApiKey.objects.get().last_used_at is None
    assert client_rw.get("/knowledge_bases").status_code == 200
    first = ApiKey.objects.get().last_used_at
    assert first is not None
    # 一分钟内的重复使用做了写入节流，不会每个请求都更新
    assert client_rw.get("/knowledge_bases").status_code == 200
    assert ApiKey.objects.get().last_used_at == first


def test_failed_auth_does_not_touch_last_used_at(make_client):
    make_client(active=False).get("/knowledge_bases")
    assert ApiKey.objects.get().last_used_at is None


@pytest.mark.parametrize("scoped", [True, False])
def test_key_lookup_is_one_query_with_its_knowledge_bases(kb_factory, scoped):
    # 鉴权在每个请求的路径上：限定的知识库 id 收在同一条语句里，不另发 prefetch 查询。语句是预备语句，不经 Django 的
    # 调试游标（django_assert_num_queries 看不到），按连接上的 execute_wrapper 数
    kbs = [kb_factory(), kb_factory()]
    key = ApiKey(name="lookup", all_knowledge_bases=not scoped, last_used_at=timezone.now())
    raw = key.set_new_key()
    key.save()
    if scoped:
        key.knowledge_bases.set(kbs)
    statements: list[str] = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    for _ in range(2):  # 第二次走已预备的语句
        with connection.execute_wrapper(record):
            principal = principal_for_key(raw)
        assert principal is not None
        assert principal.knowledge_base_ids == (frozenset(kb.id for kb in kbs) if scoped else frozenset())
        assert principal.all_knowledge_bases is not scoped
    assert len(statements) == 2
    with connection.execute_wrapper(record):
        assert principal_for_key(raw + "x") is None
    assert len(statements) == 3


# ---------------------------------------------------------------- 公开端点


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics"])
def test_probes_and_metrics_do_not_require_a_key(db, path):
    response = APIClient().get(path)
    assert response.status_code == 200, response.content


def test_probes_ignore_a_bad_key(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer nope")
    assert client.get("/health").status_code == 200


# ---------------------------------------------------------------- 作用域与校验顺序


@pytest.fixture
def scoped(make_client, kb_factory):
    """只能访问 KB A 的读写 key，以及它看不到的 KB B。"""
    kb_a = kb_factory(name="A")
    kb_b = kb_factory(name="B")
    return make_client(kbs=[kb_a]), kb_a, kb_b


def test_scoped_key_missing_kb_is_404_not_403(scoped):
    client, _, _ = scoped
    # 存在性最先判定：不存在的资源对任何 key 都是 404
    assert_error(client.get(f"/knowledge_bases/{uuid.uuid4()}"), 404, "KNOWLEDGE_BASE_NOT_FOUND")
    assert_error(client.patch(f"/knowledge_bases/{uuid.uuid4()}", {"name": "x"}, format="json"), 404,
                 "KNOWLEDGE_BASE_NOT_FOUND")
    assert_error(client.delete(f"/knowledge_bases/{uuid.uuid4()}"), 404, "KNOWLEDGE_BASE_NOT_FOUND")
    assert_error(client.get(f"/cleanup_tasks/{uuid.uuid4()}"), 404, "CLEANUP_TASK_NOT_FOUND")
    assert_error(client.post(f"/cleanup_tasks/{uuid.uuid4()}/retry"), 404, "CLEANUP_TASK_NOT_FOUND")


def test_scoped_key_can_read_own_kb_but_not_others(scoped):
    client, kb_a, kb_b = scoped
    assert client.get(f"/knowledge_bases/{kb_a.id}").json()["name"] == "A"
    assert_error(client.get(f"/knowledge_bases/{kb_b.id}"), 403, "PERMISSION_DENIED")


def test_scoped_key_patch_of_deleted_foreign_kb_is_409(scoped):
    client, _, kb_b = scoped
    KnowledgeBase.objects.filter(pk=kb_b.pk).update(status=KnowledgeBase.Status.DELETED)
    # 可用性先于权限：即使 key 无权访问 B，也先报“已删除”
    assert_error(client.patch(f"/knowledge_bases/{kb_b.id}", {"name": "x"}, format="json"), 409,
                 "KNOWLEDGE_BASE_DELETED")
    assert_error(client.delete(f"/knowledge_bases/{kb_b.id}"), 409, "KNOWLEDGE_BASE_DELETED")


def test_scoped_key_cannot_modify_or_delete_foreign_kb(scoped):
    client, _, kb_b = scoped
    assert_error(client.patch(f"/knowledge_bases/{kb_b.id}", {"name": "x"}, format="json"), 403,
                 "PERMISSION_DENIED")
    assert_error(client.delete(f"/knowledge_bases/{kb_b.id}"), 403, "PERMISSION_DENIED")
    kb_b.refresh_from_db()
    assert kb_b.name == "B" and kb_b.status == KnowledgeBase.Status.ENABLED
    assert not CleanupTask.objects.exists()


def test_scoped_key_list_shows_only_its_kbs(scoped):
    client, kb_a, _ = scoped
    body = client.get("/knowledge_bases").json()
    assert body["total"] == 1
    assert [item["id"] for item in body["items"]] == [str(kb_a.id)]


def test_scoped_key_cleanup_tasks_of_foreign_kb(scoped):
    client, _, kb_b = scoped
    task = _failed_task(kb_b)
    assert_error(client.get(f"/cleanup_tasks/{task.id}"), 403, "PERMISSION_DENIED")
    # 失败任务可重试，但 key 无权访问 B → 403，且任务保持原状
    assert_error(client.post(f"/cleanup_tasks/{task.id}/retry"), 403, "PERMISSION_DENIED")
    task.refresh_from_db()
    assert task.status == CleanupTask.Status.FAILED and task.error_message == "boom"


@pytest.mark.parametrize("status", ["pending", "running", "completed"])
def test_scoped_key_retry_of_non_failed_foreign_task_is_409(scoped, status):
    client, _, kb_b = scoped
    fields = {"processed": 0, "total": 0} if status == "completed" else {}
    task = CleanupTask.objects.create(knowledge_base=kb_b, status=status, **fields)
    # 可用性（任务状态）先于权限
    assert_error(client.post(f"/cleanup_tasks/{task.id}/retry"), 409, "CLEANUP_TASK_NOT_RETRYABLE")


def test_scoped_key_can_see_cleanup_task_of_own_kb(scoped):
    client, kb_a, _ = scoped
    task = _failed_task(kb_a)
    assert client.get(f"/cleanup_tasks/{task.id}").json()["status"] == "failed"


# ---------------------------------------------------------------- 读写权限


def test_read_only_key_can_read(make_client, kb_factory):
    kb = kb_factory(name="ro")
    task = _failed_task(kb_factory())
    client = make_client(access=ApiKey.Access.READ)
    assert client.get("/knowledge_bases").json()["total"] == 1
    assert client.get(f"/knowledge_bases/{kb.id}").status_code == 200
    assert client.get(f"/cleanup_tasks/{task.id}").status_code == 200


def test_read_only_key_cannot_write(make_client, kb_factory):
    kb = kb_factory(name="ro")
    task = _failed_task(kb_factory())
    client = make_client(access=ApiKey.Access.READ)
    assert_error(client.post("/knowledge_bases", {"name": "new"}, format="json"), 403, "PERMISSION_DENIED")
    assert_error(client.patch(f"/knowledge_bases/{kb.id}", {"name": "x"}, format="json"), 403,
                 "PERMISSION_DENIED")
    assert_error(client.delete(f"/knowledge_bases/{kb.id}"), 403, "PERMISSION_DENIED")
    assert_error(client.post(f"/cleanup_tasks/{task.id}/retry"), 403, "PERMISSION_DENIED")
    # 什么都没有被改动
    kb.refresh_from_db()
    task.refresh_from_db()
    assert kb.name == "ro" and kb.status == KnowledgeBase.Status.ENABLED
    assert task.status == CleanupTask.Status.FAILED
    assert not KnowledgeBase.objects.filter(name="new").exists()


def test_read_only_scoped_key_cannot_write_own_kb(make_client, kb_factory):
    kb = kb_factory(name="ro")
    client = make_client(access=ApiKey.Access.READ, kbs=[kb])
    assert client.get(f"/knowledge_bases/{kb.id}").status_code == 200
    assert_error(client.patch(f"/knowledge_bases/{kb.id}", {"name": "x"}, format="json"), 403,
                 "PERMISSION_DENIED")


def test_scoped_read_write_key_can_patch_own_kb_but_not_create(make_client, kb_factory):
    kb = kb_factory(name="mine")
    client = make_client(kbs=[kb])
    response = client.patch(f"/knowledge_bases/{kb.id}", {"description": "updated"}, format="json")
    assert response.status_code == 200
    assert response.json()["description"] == "updated"
    # 创建知识库需要“全部知识库 + 读写”的 key
    assert_error(client.post("/knowledge_bases", {"name": "new"}, format="json"), 403, "PERMISSION_DENIED")
    assert not KnowledgeBase.objects.filter(name="new").exists()


def test_scoped_key_name_filter_does_not_leak_other_kbs(make_client, kb_factory):
    """作用域 key 在列表里按名称过滤时也看不到别的知识库。"""
    kb_a = kb_factory(name="shared-a")
    kb_factory(name="shared-b")
    client = make_client(kbs=[kb_a])
    body = client.get("/knowledge_bases", {"name_contains": "shared"}).json()
    assert body["total"] == 1 and body["items"][0]["name"] == "shared-a"


# ---------------------------------------------------------------- 关闭鉴权（仅开发模式）


def test_auth_disabled_allows_requests_without_header(settings, kb_factory):
    settings.AUTH_ENABLED = False
    kb = kb_factory(name="open")
    client = APIClient()
    assert client.get("/knowledge_bases").json()["total"] == 1
    assert client.get(f"/knowledge_bases/{kb.id}").status_code == 200
    assert client.post("/knowledge_bases", {"name": "created"}, format="json").status_code == 201


# ---------------------------------------------------------------- createapikey 管理命令


def _create_key(*args: str) -> str:
    out = StringIO()
    call_command("createapikey", *args, stdout=out)
    return out.getvalue()


def _client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _raw_from_output(output: str) -> str:
    keys = [line for line in output.splitlines() if line.startswith("rag_")]
    assert len(keys) == 1, output
    return keys[0]


def test_createapikey_prints_a_working_key(db):
    output = _create_key("app")
    raw = _raw_from_output(output)
    key = ApiKey.objects.get(name="app")
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert key.can_write and key.all_knowledge_bases and key.is_active
    client = _client(raw)
    assert client.post("/knowledge_bases", {"name": "via-cli"}, format="json").status_code == 201


def test_createapikey_read_only(kb_factory):
    kb = kb_factory()
    raw = _raw_from_output(_create_key("reader", "--read-only"))
    assert ApiKey.objects.get(name="reader").access == ApiKey.Access.READ
    client = _client(raw)
    assert client.get(f"/knowledge_bases/{kb.id}").status_code == 200
    assert_error(client.patch(f"/knowledge_bases/{kb.id}", {"name": "x"}, format="json"), 403,
                 "PERMISSION_DENIED")


def test_createapikey_scoped_to_kb(kb_factory):
    kb_a = kb_factory()
    kb_b = kb_factory()
    raw = _raw_from_output(_create_key("scoped", "--kb", str(kb_a.id)))
    key = ApiKey.objects.get(name="scoped")
    assert not key.all_knowledge_bases
    assert list(key.knowledge_bases.all()) == [kb_a]
    client = _client(raw)
    assert client.get(f"/knowledge_bases/{kb_a.id}").status_code == 200
    assert_error(client.get(f"/knowledge_bases/{kb_b.id}"), 403, "PERMISSION_DENIED")
    assert client.get("/knowledge_bases").json()["total"] == 1


def test_createapikey_multiple_kbs(kb_factory):
    kb_a = kb_factory()
    kb_b = kb_factory()
    _create_key("two", "--kb", str(kb_a.id), "--kb", str(kb_b.id))
    assert set(ApiKey.objects.get(name="two").knowledge_bases.all()) == {kb_a, kb_b}


def test_createapikey_quiet_prints_only_the_key(db):
    output = _create_key("quiet", "--quiet")
    raw = output.strip()
    assert output.count("\n") <= 1 and raw.startswith("rag_") and " " not in raw
    assert _client(raw).get("/knowledge_bases").status_code == 200


def test_createapikey_duplicate_name_fails(db):
    _create_key("dup", "--quiet")
    with pytest.raises(CommandError, match="dup"):
        _create_key("dup")
    assert ApiKey.objects.filter(name="dup").count() == 1


@pytest.mark.parametrize("kb_id", ["6f1c2a4e-0000-4000-8000-000000000000", "not-a-uuid"])
def test_createapikey_unknown_kb_fails(kb_factory, kb_id):
    kb = kb_factory()
    with pytest.raises(CommandError, match="unknown knowledge base"):
        _create_key("bad", "--kb", str(kb.id), "--kb", kb_id)
    # 整个命令在一个事务里：失败时不会留下半成品 key
    assert not ApiKey.objects.filter(name="bad").exists()


# ---------------------------------------------------------------- 生产模式守卫


def _django_setup(tmp_path, **env: str) -> subprocess.CompletedProcess[str]:
    """在子进程里用给定环境变量加载 settings。"""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=django_settings.BASE_DIR,
        env={
            **base,
            "DJANGO_SETTINGS_MODULE": "ragservice.settings",
            "RAG_DATABASE_URL": workers.test_database_url(),
            "RAG_DATA_DIR": str(tmp_path / "data"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_refuses_disabled_auth(tmp_path):
    result = _django_setup(tmp_path, RAG_ENV="production", RAG_SECRET_KEY="x", RAG_AUTH_ENABLED="false")
    assert result.returncode != 0
    assert "RAG_AUTH_ENABLED" in result.stderr


def test_production_requires_secret_key(tmp_path):
    result = _django_setup(tmp_path, RAG_ENV="production")
    assert result.returncode != 0
    assert "RAG_SECRET_KEY" in result.stderr


def test_production_with_secret_and_auth_starts(tmp_path):
    """对照组：同样的子进程方式，配置齐全时能正常加载。"""
    result = _django_setup(tmp_path, RAG_ENV="production", RAG_SECRET_KEY="x")
    assert result.returncode == 0, result.stderr


def test_development_allows_disabled_auth(tmp_path):
    result = _django_setup(tmp_path, RAG_ENV="development", RAG_AUTH_ENABLED="false")
    assert result.returncode == 0, result.stderr
