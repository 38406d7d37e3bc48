"""真实 gunicorn 多 worker：/metrics 汇总所有 worker 的计数（PROMETHEUS_MULTIPROC_DIR），而不是只报接单的那一个。"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from knowledge.models import KnowledgeBase
from tests.workers import GunicornServer, wait_for

pytestmark = [pytest.mark.process, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKERS = 3
HEALTH_REQUESTS = 60
NOT_FOUND_REQUESTS = 5


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GunicornServer]:
    srv = GunicornServer(tmp_path, workers=WORKERS).start()
    try:
        yield srv
    finally:
        srv.stop()


def _answers(srv: GunicornServer, polls: list[str]) -> bool:
    assert srv.proc is not None
    if srv.proc.poll() is not None:
        raise AssertionError(f"gunicorn exited with {srv.proc.returncode}:\n{srv.log()}")
    try:
        response = requests.get(srv.base + "/health", headers={"Connection": "close"}, timeout=1)
    except requests.ConnectionError:
        return False  # 还没开始监听：请求没有到达服务端，不计数
    except requests.Timeout:
        polls.append("uncertain")  # 可能已被服务端计数
        return False
    polls.append("answered")
    return response.status_code == 200


def _samples(text: str) -> list[Any]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _sum(samples: list[Any], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _health_requests_in(path: Path) -> float:
    """单个 worker 的计数文件里 /health 的请求数。"""
    return sum(
        sample.value
        for metric in MultiProcessCollector.merge([str(path)])
        for sample in metric.samples
        if sample.name == "http_requests_total" and sample.labels.get("endpoint") == "/health"
    )


def _workers_that_answered(server: GunicornServer) -> list[int]:
    return [pid for pid, path in server.counter_files_by_pid().items() if _health_requests_in(path) > 0]


def test_metrics_are_aggregated_across_gunicorn_workers(server: GunicornServer):
    started = time.monotonic()
    KnowledgeBase.objects.create(name="mp-enabled")
    KnowledgeBase.objects.create(name="mp-disabled", status=KnowledgeBase.Status.DISABLED)

    polls: list[str] = []
    wait_for(lambda: _answers(server, polls), timeout=60, interval=0.3, what="gunicorn /health")
    # 每个 worker 加载应用时就会创建自己的计数文件，但预热完引擎才开始接请求（机器忙时要十几秒）：一直探活到
    # 3 个 worker 都有计数文件、且至少 2 个答过 /health，后面的请求才会分散开（探活的请求照样记在 polls 里）
    wait_for(lambda: (len(server.counter_files_by_pid()) >= WORKERS and _answers(server, polls)
                      and len(_workers_that_answered(server)) >= 2),
             timeout=120, interval=0.2, what=f"{WORKERS} gunicorn workers to load the app, two of them answering")

    request_ids = []
    for _ in range(HEALTH_REQUESTS):
        response = server.get("/health")
        assert response.status_code == 200
        assert uuid.UUID(response.headers["X-Request-ID"]).version == 4
        request_ids.append(response.headers["X-Request-ID"])
    assert len(set(request_ids)) == HEALTH_REQUESTS
    for _ in range(NOT_FOUND_REQUESTS):
        response = server.get(f"/knowledge_bases/{uuid.uuid4()}")
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "KNOWLEDGE_BASE_NOT_FOUND"

    response = server.get("/metrics")
    assert response.status_code == 200, server.log()
    assert response.headers["Content-Type"].startswith("text/plain")
    samples = _samples(response.text)

    health = _sum(samples, "http_requests_total", endpoint="/health")
    warmup = polls.count("answered")
    if "uncertain" not in polls:
        assert health == HEALTH_REQUESTS + warmup, (health, polls)
    assert HEALTH_REQUESTS + warmup <= health <= HEALTH_REQUESTS + len(polls), (health, polls)
    assert _sum(samples, "http_requests_total", method="GET", endpoint="/health", status="200") == health
    assert _sum(samples, "http_request_duration_seconds_count", endpoint="/health") == health
    assert _sum(samples, "http_request_duration_seconds_bucket", endpoint="/health", le="10.0") == health

    assert _sum(samples, "http_requests_total", method="GET", endpoint="/knowledge_bases/{kb_id}",
                status="404") == NOT_FOUND_REQUESTS
    assert "/knowledge_bases/" + "{kb_id}" in response.text
    endpoints = {s.labels.get("endpoint") for s in samples if s.name == "http_requests_total"}
    assert not [e for e in endpoints if e and re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", e)], endpoints

    # 数据库 gauge 每次抓取只报一份，不会按 worker 数重复
    active = [s for s in samples if s.name == "knowledge_bases_active"]
    assert [s.value for s in active] == [1.0], active
    assert [s.value for s in samples if s.name == "chunks_total"] == [0.0]

    # 计数来自多个 worker 进程：每个 worker 有自己的 counter_<pid>.db，且不止一个处理过 /health
    files = server.counter_files_by_pid()
    assert len(files) >= 2, sorted(files)
    assert server.proc is not None and server.proc.pid not in files  # master 不加载应用
    per_pid = {pid: _health_requests_in(path) for pid, path in files.items()}
    assert sum(per_pid.values()) == health, per_pid
    assert len([pid for pid, count in per_pid.items() if count > 0]) >= 2, per_pid
    print(f"/health requests per worker pid: {per_pid}")

    server.stop()
    assert server.proc is not None and server.proc.returncode is not None
    # worker 的访问日志是 JSON 行，带响应头里的请求 ID
    access = [json.loads(line) for line in server.log_path.read_text(errors="replace").splitlines()
              if line.startswith("{") and '"http_request"' in line]
    logged = {line["request_id"] for line in access if line.get("route") == "/health"}
    assert set(request_ids) <= logged
    elapsed = time.monotonic() - started
    assert elapsed < 120, elapsed
