"""在测试里启动真实的 django-q2 worker 子进程（连到 pytest 创建的测试库）。"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
from django.conf import settings
from django.db import connection

ROOT = Path(settings.BASE_DIR)


def test_database_url() -> str:
    """当前测试库的连接 URL（Unix socket 或 TCP 均可）。"""
    db = connection.settings_dict
    auth = quote(db["USER"] or "")
    if db["PASSWORD"]:
        auth += ":" + quote(db["PASSWORD"])
    host = db["HOST"] or ""
    if host.startswith("/"):
        return f"postgresql://{auth}@/{db['NAME']}?host={quote(host)}"
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgresql://{auth}@{host}{port}/{db['NAME']}"


class WorkerCluster:
    """一个 ``manage.py qcluster`` 子进程（连同它启动的快队列集群）；独立进程组，kill() 模拟 worker 被 SIGKILL。"""

    def __init__(self, log_path: Path, **env: str) -> None:
        self.log_path = log_path
        self.env = {
            **os.environ,
            "RAG_DATABASE_URL": test_database_url(),
            # 与测试进程（被夹具改过的）数据目录一致：上传的原始文件要能被 worker 读到
            "RAG_DATA_DIR": str(settings.DATA_DIR),
            # 任务包由 SECRET_KEY 签名，web 与 worker 必须一致
            "RAG_SECRET_KEY": settings.SECRET_KEY,
            "RAG_QUEUE_SYNC": "false",
            "RAG_QUEUE_WORKERS": "1",
            "RAG_LOG_LEVEL": "info",
            # 被 SIGKILL 的 worker 的租约几秒内就过期，回收器不必等默认的 60 秒
            "RAG_TASK_LEASE_SECONDS": "4",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerCluster:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "qcluster"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        return self

    def kill(self) -> None:
        """SIGKILL 整个进程组：哨兵、监视器与 worker 一起死，没有任何清理机会。"""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


COUNTER_FILE = re.compile(r"^counter_(\d+)\.db$")


class GunicornServer:
    """与 ``manage.py serve`` 的 ``_start_web`` 相同的 gunicorn 命令行，独立进程组。

    ``name`` 区分同一测试里的几个服务器（各自的指标目录与日志，相当于负载均衡后面的几台 web 机器）。
    """

    def __init__(self, tmp_path: Path, *, workers: int, name: str = "gunicorn", **env: str) -> None:
        self.workers = workers
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.metrics_dir = tmp_path / f"{name}-prometheus"
        self.metrics_dir.mkdir()
        self.log_path = tmp_path / f"{name}.log"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "ragservice.settings",
            "RAG_DATABASE_URL": test_database_url(),
            "RAG_SECRET_KEY": settings.SECRET_KEY,
            "RAG_DATA_DIR": str(tmp_path / "data"),
            "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir),
            "RAG_AUTH_ENABLED": "false",
            "RAG_LOG_LEVEL": "info",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> GunicornServer:
        command = [
            sys.executable, "-m", "gunicorn", "ragservice.wsgi:application",
            "--config", str(ROOT / "ragservice" / "gunicorn_conf.py"),
            "--bind", f"127.0.0.1:{self.port}",
            "--workers", str(self.workers),
            "--threads", "2",
            "--worker-class", "gthread",
            "--timeout", "120",
            "--graceful-timeout", "20",
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path.exists() else ""

    def counter_files_by_pid(self) -> dict[int, Path]:
        files = {}
        for path in self.metrics_dir.iterdir():
            match = COUNTER_FILE.match(path.name)
            if match:
                files[int(match.group(1))] = path
        return files

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        # 每次新建连接（Connection: close），让请求落到不同的 worker 上
        return requests.get(self.base + path, headers={"Connection": "close"}, timeout=10, **kwargs)


def wait_for(predicate: Callable[[], bool], *, timeout: float, interval: float = 0.2, what: str = "") -> None:
    """轮询直到条件成立；超时抛 AssertionError。"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
