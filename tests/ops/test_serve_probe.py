"""manage.py serve 启动时轮询自己的 /ready：这些请求不写访问日志，别人的 /ready 照常记录。

serve 每次启动随机生成一个请求 ID，经环境变量（``infra.logging.SELF_PROBE_ENV``）交给 web 子进程，轮询时作为
X-Request-ID 发出；``infra.logging.SelfProbeFilter`` 认出带它的 /ready 访问日志并丢掉。端到端的检查（真的起
serve、看终端输出）在 tests/ops/test_serve.py。
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from infra.logging import SELF_PROBE_ENV
from ops.management.commands.serve import _is_ready

TOKEN = "serve-ready-0123456789abcdef"


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str | None]]:
    return [(record.msg["path"], record.msg.get("upstream_request_id")) for record in caplog.records
            if record.name == "ragservice.access" and isinstance(record.msg, dict)
            and record.msg.get("event") == "http_request"]


@pytest.fixture
def always_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    # 就绪检查本身（数据库、worker、模型）与这里无关：直接算作就绪
    monkeypatch.setattr("ops.views.readiness", lambda: [])


def test_own_ready_polls_are_not_logged(client: Any, caplog: pytest.LogCaptureFixture, always_ready: None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SELF_PROBE_ENV, TOKEN)
    caplog.set_level(logging.INFO, logger="ragservice.access")
    assert client.get("/ready", HTTP_X_REQUEST_ID=TOKEN).status_code == 200
    assert client.get("/ready").status_code == 200
    client.get("/ready", HTTP_X_REQUEST_ID="k8s-probe-1")
    client.get("/health", HTTP_X_REQUEST_ID=TOKEN)  # 只认 /ready
    assert _access_lines(caplog) == [("/ready", None), ("/ready", "k8s-probe-1"), ("/health", TOKEN)]


def test_without_serve_every_ready_request_is_logged(client: Any, caplog: pytest.LogCaptureFixture,
                                                     always_ready: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # 不经 serve 启动的 gunicorn（容器布局）没有令牌：同样的请求 ID 也照常记录
    monkeypatch.delenv(SELF_PROBE_ENV, raising=False)
    caplog.set_level(logging.INFO, logger="ragservice.access")
    client.get("/ready", HTTP_X_REQUEST_ID=TOKEN)
    assert _access_lines(caplog) == [("/ready", TOKEN)]


@pytest.fixture
def fake_web() -> Iterator[tuple[str, list[str | None], list[int]]]:
    """记下收到的 X-Request-ID、按给定状态码回答的本机 HTTP 服务。"""
    seen: list[str | None] = []
    status = [200]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("X-Request-ID"))
            self.send_response(status[0])
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/ready", seen, status
    finally:
        server.shutdown()
        server.server_close()


def test_serve_polls_with_its_probe_id(fake_web: tuple[str, list[str | None], list[int]]) -> None:
    url, seen, status = fake_web
    assert _is_ready(url, probe_id=TOKEN) is True
    status[0] = 503
    assert _is_ready(url, probe_id=TOKEN) is False
    assert seen == [TOKEN, TOKEN]
