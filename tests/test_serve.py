"""端到端：全新数据目录上 ``manage.py serve``（README 第一条命令的主体）拉起内嵌 PostgreSQL、
web 与 worker，/ready 变为 200，API key 可用，删除知识库由真实 worker 清理完成，SIGTERM 优雅退出。"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests
from django.conf import settings

from tests.workers import wait_for

pytestmark = pytest.mark.slow
ROOT = settings.BASE_DIR


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(base: str) -> bool:
    try:
        return requests.get(f"{base}/ready", timeout=5).status_code == 200
    except requests.ConnectionError:
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
        wait_for(lambda: _ready(base), timeout=180, interval=1, what="/ready == 200")
        banner = log_path.read_text()
        assert base in banner and "createapikey" in banner and "/api/docs/" in banner

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

        os.killpg(server.pid, signal.SIGTERM)
        started = time.monotonic()
        assert server.wait(timeout=40) == 0
        assert time.monotonic() - started < 40
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        subprocess.run([*manage, "embeddeddb", "stop"], cwd=ROOT, env=env, capture_output=True, timeout=60)
