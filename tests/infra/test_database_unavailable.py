"""数据库连不上时每个端点答 503 SERVICE_UNAVAILABLE + Retry-After（不是 500），恢复后自动好转。

这里让本进程的连接指向一个不存在的 socket 目录：驱动真实地连接失败（与服务器停机时同样的异常），
而测试库本身不受影响。真正停掉、再启动 PostgreSQL 的端到端场景见 tests/ops/test_fault_injection.py。
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connections
from django.test import Client

from tests.conftest import assert_error

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def unreachable_database(tmp_path: Path) -> Iterator[None]:
    """本进程的默认连接改指一个没有服务器的 socket 目录；退出时恢复。"""
    conn = connections["default"]
    saved = {key: conn.settings_dict[key] for key in ("HOST", "PORT")}
    conn.close()
    conn.settings_dict.update(HOST=str(tmp_path / "no-server-here"), PORT="5432")
    try:
        yield
    finally:
        conn.close()
        conn.settings_dict.update(saved)


def _assert_database_unavailable(response, tmp_path: Path) -> dict:
    error = assert_error(response, 503, "SERVICE_UNAVAILABLE")
    assert response["Retry-After"].isdigit()
    body = response.content.decode()
    # 驱动报错原文（socket 路径、主机名）绝不出现在响应里
    assert str(tmp_path) not in body and "no-server-here" not in body and "connection" not in body.lower()
    return error


@pytest.mark.parametrize(("method", "path", "body"), [
    ("get", "/knowledge_bases", None),
    ("post", "/knowledge_bases", {"name": "x"}),
    ("post", "/search", {"knowledge_base_id": "00000000-0000-0000-0000-000000000001", "query": "x"}),
    ("get", "/documents/00000000-0000-0000-0000-000000000001", None),
])
def test_api_answers_503_while_the_database_is_away_and_recovers(make_client, tmp_path, method, path, body):
    client = make_client()
    # 鉴权本身就要查 API key：数据库不在时第一步就失败，仍须是 503
    with unreachable_database(tmp_path):
        response = getattr(client, method)(path, body, format="json")
    error = _assert_database_unavailable(response, tmp_path)
    assert error["details"] == [{"field": None, "code": "DATABASE_UNAVAILABLE",
                                 "message": "The database cannot be reached"}]
    # 恢复：同一进程、不重启，下一次请求就正常
    assert getattr(client, method)(path, body, format="json").status_code < 500


@pytest.mark.parametrize("path", ["/admin/", "/admin/documents/document/", "/playground/"])
def test_human_pages_answer_503_not_500(db, django_user_model, tmp_path, path):
    # 已登录的维护者：会话与用户都要查库。非 DRF 视图的异常经 Django 的 handler500 渲染，那里同样识别
    client = Client(raise_request_exception=False)
    client.force_login(django_user_model.objects.create_superuser("ops", "ops@example.com", "pw"))
    with unreachable_database(tmp_path):
        response = client.get(path)
    _assert_database_unavailable(response, tmp_path)
    assert client.get(path).status_code == 200


def test_ready_names_the_failed_check_in_plain_words(db, tmp_path):
    with unreachable_database(tmp_path):
        response = Client().get("/ready")
    error = _assert_database_unavailable(response, tmp_path)
    details = {d["field"]: d["message"] for d in error["details"]}
    assert details["database"] == "The database cannot be reached"


def test_metrics_are_scraped_while_the_database_is_away(db, tmp_path, settings):
    """issue 23：/metrics 曾因抓取时查库的库存 gauge（knowledge_bases_active、chunks_total）整体 503——
    数据库不在时恰恰最需要进程指标。现在只缺那两个 gauge，其余照常，恢复后自动回来。"""
    settings.METRICS_ENABLED = True
    client = Client()
    client.get("/health")  # 至少有一条 HTTP 指标
    with unreachable_database(tmp_path):
        response = client.get("/metrics")
    assert response.status_code == 200, response.content
    body = response.content.decode()
    assert "http_requests_total{" in body and "http_request_duration_seconds_bucket{" in body
    assert "\nknowledge_bases_active " not in body and "\nchunks_total " not in body
    assert str(tmp_path) not in body
    recovered = client.get("/metrics").content.decode()
    assert "\nknowledge_bases_active " in recovered and "\nchunks_total " in recovered
