"""管理后台：登录要求、列表页、知识库/清理任务/API key 的动作与表单都经过服务层。"""

from __future__ import annotations

import hashlib
import re

import pytest
from django.contrib import messages as django_messages
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from rest_framework.test import APIClient

from knowledge.models import CleanupTask, KnowledgeBase
from ops.models import ApiKey
from tests.factories import add_documents

pytestmark = pytest.mark.django_db

KB_CHANGELIST = reverse("admin:knowledge_knowledgebase_changelist")
TASK_CHANGELIST = reverse("admin:knowledge_cleanuptask_changelist")
KEY_CHANGELIST = reverse("admin:ops_apikey_changelist")
RAW_KEY = re.compile(r"rag_[A-Za-z0-9_-]{43}")


def _messages(response) -> list[tuple[int, str]]:
    """跟随重定向后页面上渲染的消息（级别, 文本）。"""
    return [(m.level, str(m)) for m in response.context["messages"]]


def _action(admin_client, url: str, action: str, *pks) -> list[tuple[int, str]]:
    response = admin_client.post(url, {"action": action, "_selected_action": [str(pk) for pk in pks]},
                                 follow=True)
    assert response.status_code == 200
    return _messages(response)


def _api(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


# ---------------------------------------------------------------- 登录与列表页


@pytest.mark.parametrize("url", ["/admin/", KB_CHANGELIST, TASK_CHANGELIST, KEY_CHANGELIST])
def test_admin_requires_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_api_key_does_not_grant_admin_access(client_rw):
    response = client_rw.get("/admin/")
    assert response.status_code == 302


# ---------------------------------------------------------------- 登录的防暴力破解（issue 23）

LOGIN = reverse("admin:login")


@pytest.fixture
def login_limits(settings, django_user_model):
    settings.ADMIN_LOGIN_MAX_FAILURES = 3
    settings.ADMIN_LOGIN_WINDOW = 900
    django_user_model.objects.create_superuser("ops", "ops@example.com", "right-password")
    return settings


def _login(client, password: str, username: str = "ops", ip: str = "10.0.0.1"):
    return client.post(LOGIN, {"username": username, "password": password, "next": "/admin/"}, REMOTE_ADDR=ip)


def _logged_in(client) -> bool:
    return "_auth_user_id" in client.session


def test_admin_login_is_refused_after_too_many_failures_even_with_the_right_password(client, login_limits):
    """探测里 30 次错误密码都是 200，第 31 次用对的密码就登进去了。"""
    for _ in range(3):
        response = _login(client, "wrong")
        assert response.status_code == 200 and not _logged_in(client)
        assert "请输入一个正确的" in response.content.decode() or "correct" in response.content.decode()
    refused = _login(client, "right-password")
    assert refused.status_code == 429 and not _logged_in(client)
    assert int(refused["Retry-After"]) >= 1
    page = refused.content.decode()
    assert "登录失败次数过多" in page and f"{refused['Retry-After']} 秒后再试" in page
    # 按（用户名，地址）计：别的地址、同一地址上的别的用户名不受影响
    assert _login(client, "right-password", ip="10.0.0.2").status_code == 302 and _logged_in(client)
    client.logout()
    assert _login(client, "wrong", username="someone-else").status_code == 200


def test_admin_login_success_clears_the_failure_count(client, login_limits):
    for _ in range(2):
        _login(client, "wrong")
    assert _login(client, "right-password").status_code == 302 and _logged_in(client)
    client.logout()
    for _ in range(2):
        assert _login(client, "wrong").status_code == 200
    assert _login(client, "right-password").status_code == 302 and _logged_in(client)


def test_admin_login_gets_a_chance_back_as_the_window_passes(client, login_limits, django_user_model):
    import time

    # 窗口 6 秒、3 次机会：每 2 秒补回一次。快速的哈希让 4 次尝试远在 2 秒内做完
    login_limits.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    user = django_user_model.objects.get(username="ops")
    user.set_password("right-password")
    user.save()
    login_limits.ADMIN_LOGIN_WINDOW = 6
    for _ in range(3):
        _login(client, "wrong")
    assert _login(client, "right-password").status_code == 429
    time.sleep(2.1)
    assert _login(client, "right-password").status_code == 302 and _logged_in(client)


def test_admin_index_renders(admin_client):
    assert admin_client.get("/admin/").status_code == 200


@pytest.mark.parametrize("url", [KB_CHANGELIST, TASK_CHANGELIST, KEY_CHANGELIST])
def test_changelists_render(admin_client, kb_factory, make_client, url):
    kb = kb_factory(name="列表库")
    deleted = kb_factory(name="gone", status=KnowledgeBase.Status.DELETED)
    CleanupTask.objects.create(knowledge_base=deleted, status=CleanupTask.Status.COMPLETED, processed=3, total=3)
    CleanupTask.objects.create(knowledge_base=deleted)
    make_client(kbs=[kb])
    response = admin_client.get(url)
    assert response.status_code == 200
    assert response.context["cl"].result_count >= 1


def test_cleanup_task_progress_column(admin_client, kb_factory):
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    CleanupTask.objects.create(knowledge_base=kb, status=CleanupTask.Status.COMPLETED, processed=4, total=4)
    content = admin_client.get(TASK_CHANGELIST).content.decode()
    assert "4 / 4（100%）" in content


def test_kb_changelist_filter_and_search(admin_client, kb_factory):
    kb_factory(name="招标-一", description="alpha")
    kb_factory(name="招标-二", status=KnowledgeBase.Status.DISABLED)
    kb_factory(name="合同", status=KnowledgeBase.Status.DISABLED)

    def names(params):
        response = admin_client.get(KB_CHANGELIST, params)
        assert response.status_code == 200
        return sorted(kb.name for kb in response.context["cl"].result_list)

    assert names({"status__exact": "disabled"}) == ["合同", "招标-二"]
    assert names({"q": "招标"}) == ["招标-一", "招标-二"]
    assert names({"q": "招标", "status__exact": "disabled"}) == ["招标-二"]
    assert names({"q": "alpha"}) == ["招标-一"]


def test_detail_pages_render(admin_client, kb_factory, make_client):
    kb = kb_factory()
    deleted = kb_factory(status=KnowledgeBase.Status.DELETED)
    task = CleanupTask.objects.create(knowledge_base=deleted)
    make_client()
    key = ApiKey.objects.get()
    for url in (
        reverse("admin:knowledge_knowledgebase_change", args=[kb.pk]),
        reverse("admin:knowledge_knowledgebase_change", args=[deleted.pk]),
        reverse("admin:knowledge_knowledgebase_add"),
        reverse("admin:knowledge_cleanuptask_change", args=[task.pk]),
        reverse("admin:ops_apikey_change", args=[key.pk]),
        reverse("admin:ops_apikey_add"),
    ):
        assert admin_client.get(url).status_code == 200, url


# ---------------------------------------------------------------- 知识库动作


def test_disable_and_enable_actions(admin_client, kb_factory):
    kb = kb_factory()
    other = kb_factory()
    _action(admin_client, KB_CHANGELIST, "disable", kb.pk, other.pk)
    kb.refresh_from_db()
    other.refresh_from_db()
    assert kb.status == other.status == KnowledgeBase.Status.DISABLED

    _action(admin_client, KB_CHANGELIST, "enable", kb.pk)
    kb.refresh_from_db()
    other.refresh_from_db()
    assert kb.status == KnowledgeBase.Status.ENABLED
    assert other.status == KnowledgeBase.Status.DISABLED


def test_status_action_on_deleted_kb_warns_and_changes_nothing(admin_client, kb_factory):
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    messages = _action(admin_client, KB_CHANGELIST, "enable", kb.pk)
    assert any(level == django_messages.WARNING for level, _ in messages)
    kb.refresh_from_db()
    assert kb.status == KnowledgeBase.Status.DELETED


def test_soft_delete_action_creates_and_runs_cleanup(admin_client, kb_factory,
                                                     django_capture_on_commit_callbacks):
    kb = kb_factory()
    total = add_documents(kb, documents=2, chunks_per_document=3, dim=8)
    with django_capture_on_commit_callbacks(execute=True):
        messages = _action(admin_client, KB_CHANGELIST, "soft_delete", kb.pk)
    kb.refresh_from_db()
    assert kb.status == KnowledgeBase.Status.DELETED and kb.deleted_at is not None
    task = CleanupTask.objects.get(knowledge_base=kb)
    assert task.status == CleanupTask.Status.COMPLETED
    assert task.processed == task.total == total
    assert any(str(task.id) in text for _, text in messages)


def test_soft_delete_action_on_deleted_kb_warns(admin_client, kb_factory):
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    messages = _action(admin_client, KB_CHANGELIST, "soft_delete", kb.pk)
    assert any(level == django_messages.WARNING for level, _ in messages)
    assert not CleanupTask.objects.exists()


def test_hard_delete_is_not_permitted(admin_client, kb_factory):
    kb = kb_factory()
    url = reverse("admin:knowledge_knowledgebase_delete", args=[kb.pk])
    assert admin_client.get(url).status_code == 403
    assert admin_client.post(url, {"post": "yes"}).status_code == 403
    # 批量删除动作也不存在
    _action(admin_client, KB_CHANGELIST, "delete_selected", kb.pk)
    assert KnowledgeBase.objects.filter(pk=kb.pk, status=KnowledgeBase.Status.ENABLED).exists()


def test_cleanup_tasks_cannot_be_added_or_deleted(admin_client, kb_factory):
    task = CleanupTask.objects.create(knowledge_base=kb_factory(status=KnowledgeBase.Status.DELETED))
    assert admin_client.get(reverse("admin:knowledge_cleanuptask_add")).status_code == 403
    assert admin_client.get(reverse("admin:knowledge_cleanuptask_delete", args=[task.pk])).status_code == 403
    assert CleanupTask.objects.filter(pk=task.pk).exists()


# ---------------------------------------------------------------- 清理任务重试


def test_retry_action_on_failed_task(admin_client, kb_factory, django_capture_on_commit_callbacks):
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    total = add_documents(kb, documents=1, chunks_per_document=4, dim=8)
    task = CleanupTask.objects.create(knowledge_base=kb, status=CleanupTask.Status.FAILED,
                                      processed=1, total=total, error_message="boom")
    with django_capture_on_commit_callbacks(execute=True):
        messages = _action(admin_client, TASK_CHANGELIST, "retry", task.pk)
    assert any(str(task.id) in text and level == django_messages.INFO for level, text in messages)
    task.refresh_from_db()
    assert task.status == CleanupTask.Status.COMPLETED
    assert task.processed == task.total == total
    assert task.error_message == ""


def test_retry_action_resets_failed_task(admin_client, kb_factory):
    """不执行 on_commit 回调时，可以看到重试把任务重置为 pending。"""
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    task = CleanupTask.objects.create(knowledge_base=kb, status=CleanupTask.Status.FAILED,
                                      processed=2, total=5, error_message="boom")
    _action(admin_client, TASK_CHANGELIST, "retry", task.pk)
    task.refresh_from_db()
    assert (task.status, task.processed, task.total, task.attempts, task.error_message) == (
        CleanupTask.Status.PENDING, 0, None, 0, "")


def test_retry_action_on_completed_task_warns(admin_client, kb_factory, django_capture_on_commit_callbacks):
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    task = CleanupTask.objects.create(knowledge_base=kb, status=CleanupTask.Status.COMPLETED, processed=2, total=2)
    before = CleanupTask.objects.values().get(pk=task.pk)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        messages = _action(admin_client, TASK_CHANGELIST, "retry", task.pk)
    assert callbacks == []
    assert [level for level, _ in messages] == [django_messages.WARNING]
    assert str(task.id) in messages[0][1]
    assert CleanupTask.objects.values().get(pk=task.pk) == before


# ---------------------------------------------------------------- API key


def _add_key(admin_client, **fields):
    data = {"name": "admin-made", "access": ApiKey.Access.READ_WRITE, "all_knowledge_bases": "on",
            "is_active": "on", **fields}
    response = admin_client.post(reverse("admin:ops_apikey_add"), data, follow=True)
    assert response.status_code == 200
    return response


def test_add_api_key_shows_raw_key_once(admin_client):
    response = _add_key(admin_client)
    key = ApiKey.objects.get(name="admin-made")
    raws = [m for _, text in _messages(response) for m in RAW_KEY.findall(text)]
    assert len(raws) == 1
    raw = raws[0]
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert key.key_prefix == raw[:10]
    assert raw not in str(ApiKey.objects.values().get(pk=key.pk))
    assert _api(raw).get("/knowledge_bases").status_code == 200
    # 之后再打开该 key 的页面，明文不再出现
    page = admin_client.get(reverse("admin:ops_apikey_change", args=[key.pk])).content.decode()
    assert raw not in page
    assert raw not in admin_client.get(KEY_CHANGELIST).content.decode()


def test_add_scoped_read_only_api_key(admin_client, kb_factory):
    kb_a = kb_factory()
    kb_b = kb_factory()
    response = _add_key(admin_client, access=ApiKey.Access.READ, all_knowledge_bases="",
                        knowledge_bases=[str(kb_a.pk)])
    raw = next(m for _, text in _messages(response) for m in RAW_KEY.findall(text))
    key = ApiKey.objects.get(name="admin-made")
    assert not key.all_knowledge_bases and list(key.knowledge_bases.all()) == [kb_a]
    client = _api(raw)
    assert client.get(f"/knowledge_bases/{kb_a.id}").status_code == 200
    assert client.get(f"/knowledge_bases/{kb_b.id}").status_code == 403
    assert client.patch(f"/knowledge_bases/{kb_a.id}", {"name": "x"}, format="json").status_code == 403


def test_editing_api_key_keeps_its_hash(admin_client, make_client):
    client = make_client()
    key = ApiKey.objects.get()
    response = admin_client.post(
        reverse("admin:ops_apikey_change", args=[key.pk]),
        {"name": "renamed", "access": ApiKey.Access.READ, "all_knowledge_bases": "on", "is_active": "on"},
        follow=True,
    )
    assert response.status_code == 200
    assert not any(RAW_KEY.search(text) for _, text in _messages(response))
    updated = ApiKey.objects.get(pk=key.pk)
    assert updated.name == "renamed" and updated.key_hash == key.key_hash
    assert client.get("/knowledge_bases").status_code == 200


def test_rotate_action_replaces_key(admin_client, make_client):
    old_client = make_client()
    key = ApiKey.objects.get()
    messages = _action(admin_client, KEY_CHANGELIST, "rotate", key.pk)
    raws = [m for _, text in messages for m in RAW_KEY.findall(text)]
    assert len(raws) == 1
    rotated = ApiKey.objects.get(pk=key.pk)
    assert rotated.key_hash != key.key_hash
    assert rotated.key_hash == hashlib.sha256(raws[0].encode()).hexdigest()
    # 旧密钥立即失效，新密钥可用
    assert old_client.get("/knowledge_bases").status_code == 401
    assert _api(raws[0]).get("/knowledge_bases").status_code == 200


def test_revoke_action_deactivates_key(admin_client, make_client):
    client = make_client()
    other = make_client()
    key = ApiKey.objects.get(key_hash=hashlib.sha256(client.raw_key.encode()).hexdigest())
    _action(admin_client, KEY_CHANGELIST, "revoke", key.pk)
    key.refresh_from_db()
    assert key.is_active is False
    assert client.get("/knowledge_bases").status_code == 401
    assert other.get("/knowledge_bases").status_code == 200


# ---------------------------------------------------------------- 知识库表单经过服务层


def _change_kb(admin_client, kb, **fields):
    data = {"name": kb.name, "description": kb.description, "status": kb.status, **fields}
    return admin_client.post(reverse("admin:knowledge_knowledgebase_change", args=[kb.pk]), data, follow=True)


def test_change_form_updates_kb(admin_client, kb_factory):
    kb = kb_factory(name="old")
    response = _change_kb(admin_client, kb, name="new", status=KnowledgeBase.Status.DISABLED)
    assert response.status_code == 200
    kb.refresh_from_db()
    assert (kb.name, kb.status) == ("new", KnowledgeBase.Status.DISABLED)
    assert not any(level == django_messages.ERROR for level, _ in _messages(response))


def test_change_form_duplicate_name_shows_error_and_does_not_save(admin_client, kb_factory):
    kb_factory(name="taken")
    kb = kb_factory(name="mine", description="keep")
    response = _change_kb(admin_client, kb, name="taken", description="changed")
    # 部分唯一约束在表单校验阶段（Model.validate_constraints）就拦下：表单带错误重新渲染，不重定向
    assert response.status_code == 200 and response.redirect_chain == []
    form = response.context["adminform"].form
    assert form.non_field_errors()
    assert "已有同名且未删除的知识库" in response.content.decode()
    kb.refresh_from_db()
    assert (kb.name, kb.description) == ("mine", "keep")
    assert not LogEntry.objects.exists()


@pytest.fixture
def skip_form_constraints(monkeypatch):
    """模拟并发：表单校验时名称尚未被占用，写入时才由服务层（数据库唯一索引）发现冲突。"""
    monkeypatch.setattr(KnowledgeBase, "validate_constraints", lambda self, exclude=None: None)


def test_change_form_service_conflict_shows_error_and_does_not_save(admin_client, kb_factory,
                                                                    skip_form_constraints):
    kb_factory(name="taken")
    kb = kb_factory(name="mine", description="keep")
    response = _change_kb(admin_client, kb, name="taken", description="changed")
    assert response.status_code == 200
    errors = [text for level, text in _messages(response) if level == django_messages.ERROR]
    assert len(errors) == 1 and "taken" in errors[0]
    kb.refresh_from_db()
    assert (kb.name, kb.description) == ("mine", "keep")


def test_deleted_kb_change_page_is_view_only(admin_client, kb_factory):
    """已删除知识库：详情页可看（审计），但提交修改被拒绝，不记日志。"""
    kb = kb_factory(name="gone", status=KnowledgeBase.Status.DELETED)
    url = reverse("admin:knowledge_knowledgebase_change", args=[kb.pk])
    assert admin_client.get(url).status_code == 200
    assert admin_client.post(url, {"name": "back"}).status_code == 403
    kb.refresh_from_db()
    assert kb.name == "gone"
    assert not LogEntry.objects.exists()


def test_add_form_service_conflict_is_not_reported_as_success(admin_client, kb_factory, skip_form_constraints):
    kb_factory(name="taken")
    response = admin_client.post(reverse("admin:knowledge_knowledgebase_add"),
                                 {"name": "taken", "description": "", "status": "enabled"}, follow=True)
    levels = [level for level, _ in _messages(response)]
    assert django_messages.ERROR in levels
    assert KnowledgeBase.objects.filter(name="taken").count() == 1
    # 不应为一个并不存在的对象记“已添加”日志并提示成功
    assert django_messages.SUCCESS not in levels
    assert not LogEntry.objects.exists()


def test_change_form_cannot_set_deleted_status(admin_client, kb_factory):
    kb = kb_factory()
    response = admin_client.post(reverse("admin:knowledge_knowledgebase_change", args=[kb.pk]),
                                 {"name": kb.name, "description": "", "status": "deleted"})
    assert response.status_code == 200  # 表单校验失败，重新渲染
    assert "status" in response.context["adminform"].form.errors
    kb.refresh_from_db()
    assert kb.status == KnowledgeBase.Status.ENABLED


def test_add_form_creates_kb_through_service(admin_client):
    response = admin_client.post(reverse("admin:knowledge_knowledgebase_add"),
                                 {"name": "admin-kb", "description": "d", "status": "enabled"}, follow=True)
    assert response.status_code == 200
    kb = KnowledgeBase.objects.get(name="admin-kb")
    assert kb.description == "d" and kb.status == KnowledgeBase.Status.ENABLED


def test_admin_permission_denied_is_an_html_page(client, django_user_model, kb_factory):
    """没有对应权限的维护者看到的是 Django 的 HTML 403 页，而不是 API 的 JSON 错误体；API 路径仍是 JSON。"""
    staff = django_user_model.objects.create_user("viewer", password="pw-123456", is_staff=True)
    client.force_login(staff)
    kb = kb_factory()
    response = client.get(reverse("admin:knowledge_knowledgebase_change", args=[kb.pk]))
    assert response.status_code == 403
    assert response["Content-Type"].startswith("text/html")
    api = client.post("/knowledge_bases", {"name": "x"}, content_type="application/json")
    assert api.status_code in (401, 403) and api["Content-Type"].startswith("application/json")
