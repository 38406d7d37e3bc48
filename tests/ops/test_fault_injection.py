"""端到端故障注入：真的停掉、再启动 PostgreSQL，真的 SIGKILL worker。

为了不影响其余测试使用的测试库，这里另起一个内嵌 PostgreSQL（临时目录里 initdb），在上面迁移，
再起真实的 gunicorn web 与 qcluster worker（主队列 + 快队列），全部经 HTTP 观察：
- 数据库停机期间检索、列表与 /ready 答 503 + Retry-After，重新启动后不重启任何进程即恢复；
- 摄取（embed 阶段）与清理（分批删除途中）遇到数据库停机：记录原因、按退避重试，最终完成；
- “没有丢失的工作”：一批已答 202 的上传，经历 worker SIGKILL 与数据库重启后，每一份都以
  completed 或 failed 结束，没有停在 processing 的。
整个模块一次 initdb + 迁移 + 启动，约两三分钟；标记为 slow，CI 照常运行。
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from django.conf import settings

from infra.embedded_db import ensure_embedded_database, stop_embedded_database
from ops.management.commands.serve import stop_groups, web_command
from tests.workers import WorkerCluster, wait_for

pytestmark = [pytest.mark.process, pytest.mark.slow]
ROOT = Path(settings.BASE_DIR)
PARAGRAPH = "本项目为政务云平台建设项目，投标人须具备相应资质，投标文件应包括商务部分和技术部分。"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Stack:
    """第二个 PostgreSQL + web + worker，以及停启它们的手柄。"""

    root: Path
    env: dict[str, str]
    base: str
    headers: dict[str, str]
    web: subprocess.Popen[bytes]
    worker: WorkerCluster

    @property
    def url(self) -> str:
        return self.env["RAG_DATABASE_URL"]

    def stop_database(self) -> None:
        assert stop_embedded_database(self.root / "pg")

    def start_database(self) -> None:
        assert ensure_embedded_database(self.root / "pg") == self.url  # 同一个 socket，客户端无需任何改动

    def restart_worker(self) -> None:
        self.worker.kill()
        self.worker = WorkerCluster(self.root / f"worker-{time.monotonic_ns()}.log", **self.env).start()

    def reap(self) -> None:
        """立即跑一次孤儿回收（生产里它每分钟由快队列调度一次）。"""
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-c",
                        "from ops.tasks import reap_stale_tasks; reap_stale_tasks()"],
                       cwd=ROOT, env=self.env, check=True, capture_output=True, timeout=120)

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return requests.request(method, f"{self.base}{path}", headers=self.headers, timeout=30, **kwargs)

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def upload(self, kb_id: str, name: str, text: str) -> str:
        response = self.api("POST", f"/knowledge_bases/{kb_id}/documents",
                            files={"file": (name, text.encode(), "text/markdown")})
        assert response.status_code == 202, response.text
        return str(response.json()["document_id"])

    def document(self, document_id: str) -> dict[str, Any]:
        return dict(self.api("GET", f"/documents/{document_id}").json())

    def logs(self) -> str:
        return "\n".join(path.read_text(errors="replace")[-4000:] for path in sorted(self.root.glob("*.log")))


def _ready(base: str) -> bool:
    try:
        return requests.get(f"{base}/ready", timeout=5).status_code == 200
    except (requests.ConnectionError, requests.Timeout):
        return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("faults")
    (root / "pg").mkdir()
    url = ensure_embedded_database(root / "pg")
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "DJANGO_SETTINGS_MODULE")}
    env |= {
        "RAG_DATABASE_URL": url, "RAG_DATA_DIR": str(root / "data"), "RAG_SECRET_KEY": "fault-injection-" * 4,
        "RAG_QUEUE_SYNC": "false", "RAG_QUEUE_WORKERS": "1", "RAG_WEB_WORKERS": "1", "RAG_LOG_LEVEL": "info",
        "RAG_RERANK_PROVIDER": "none",  # 默认的重排序模型在这里无法下载
        # 退避与租约缩短到秒级，故障后几秒内就能看到重试与回收
        "RAG_INGEST_RETRY_BASE_SECONDS": "1", "RAG_CLEANUP_RETRY_BASE_SECONDS": "1",
        "RAG_TASK_LEASE_SECONDS": "10", "RAG_STALE_TASK_SECONDS": "5",
        "RAG_CLEANUP_BATCH_SIZE": "20", "RAG_CLEANUP_BATCH_PAUSE_MS": "150",
    }
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True, timeout=300)
    key = subprocess.run([*manage, "createapikey", "faults", "--quiet"], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=120).stdout.strip().splitlines()[-1]
    port = _free_port()
    (root / "metrics").mkdir()
    web_env = env | {"PROMETHEUS_MULTIPROC_DIR": str(root / "metrics")}
    with (root / "web.log").open("ab") as log:
        web = subprocess.Popen(web_command("127.0.0.1", port, workers=1), cwd=ROOT, env=web_env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    worker = WorkerCluster(root / "worker.log", **env).start()
    stack = Stack(root=root, env=env, base=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"},
                  web=web, worker=worker)
    try:
        wait_for(lambda: _ready(stack.base), timeout=240, interval=1, what="/ready == 200 on the second server")
        yield stack
    finally:
        stack.worker.stop()
        stop_groups([web], timeout=10)
        stop_embedded_database(root / "pg")


def _knowledge_base(stack: Stack, name: str) -> str:
    response = stack.api("POST", "/knowledge_bases", json={
        "name": name, "chunking": {"strategy": "token", "chunk_size": 64, "overlap": 0}})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _text(sections: int) -> str:
    return "\n\n".join(f"## 第{i}节\n\n{PARAGRAPH * 3}" for i in range(sections))


def _assert_unavailable(response: requests.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "SERVICE_UNAVAILABLE"
    assert int(response.headers["Retry-After"]) > 0
    assert ".s.PGSQL" not in response.text and "socket" not in response.text


def test_search_answers_503_while_postgres_is_down_and_recovers_without_restart(stack: Stack) -> None:
    kb_id = _knowledge_base(stack, "search-outage")
    document_id = stack.upload(kb_id, "a.md", _text(3))
    wait_for(lambda: stack.document(document_id)["status"] == "completed", timeout=120, what="ingestion")
    query = {"knowledge_base_id": kb_id, "query": "投标文件包括什么", "top_k": 3}
    assert stack.api("POST", "/search", json=query).status_code == 200

    stack.stop_database()
    try:
        _assert_unavailable(stack.api("POST", "/search", json=query))
        _assert_unavailable(stack.api("GET", "/knowledge_bases"))
        ready = requests.get(f"{stack.base}/ready", timeout=30)
        _assert_unavailable(ready)
        details = {d["field"]: d["message"] for d in ready.json()["error"]["details"]}
        assert details["database"] == "The database cannot be reached"
    finally:
        stack.start_database()
    # 同一组进程，数据库回来后自动恢复
    wait_for(lambda: stack.api("POST", "/search", json=query).status_code == 200, timeout=30,
             what="search to recover")
    assert stack.api("POST", "/search", json=query).json()  # 命中列表非空


def test_ingestion_and_cleanup_resume_after_postgres_restarts(stack: Stack) -> None:
    kb_id = _knowledge_base(stack, "ingest-outage")
    document_id = stack.upload(kb_id, "big.md", _text(120))
    wait_for(lambda: stack.sql("SELECT stage FROM documents WHERE id = %s", document_id) == [("embed",)],
             timeout=120, interval=0.05, what="ingestion to reach the embed stage")
    stack.stop_database()
    time.sleep(3)
    _assert_unavailable(stack.api("GET", f"/documents/{document_id}"))
    stack.start_database()
    wait_for(lambda: stack.document(document_id)["status"] != "processing", timeout=180,
             what="ingestion to finish after the restart")
    document = stack.document(document_id)
    assert document["status"] == "completed", (document, stack.logs())
    assert document["chunk_count"] > 100

    deleted = stack.api("DELETE", f"/knowledge_bases/{kb_id}")
    assert deleted.status_code == 202
    task_id = deleted.json()["cleanup_task_id"]
    wait_for(lambda: stack.api("GET", f"/cleanup_tasks/{task_id}").json()["progress"]["processed"] > 20,
             timeout=60, interval=0.1, what="cleanup progress")
    stack.stop_database()
    time.sleep(3)
    stack.start_database()
    wait_for(lambda: stack.api("GET", f"/cleanup_tasks/{task_id}").json()["status"] == "completed", timeout=180,
             what="cleanup to finish after the restart")
    task = stack.api("GET", f"/cleanup_tasks/{task_id}").json()
    assert task["progress"]["processed"] == task["progress"]["total"] > 100, (task, stack.logs())


def test_nothing_acknowledged_is_lost_across_worker_kills_and_database_restarts(stack: Stack) -> None:
    kb_id = _knowledge_base(stack, "nothing-lost")
    accepted = [stack.upload(kb_id, f"doc-{i}.md", _text(5 + i)) for i in range(8)]
    time.sleep(1)
    stack.worker.kill()  # 正在处理的、已从队列取走还没开始的，都成了孤儿
    stack.stop_database()
    time.sleep(2)
    stack.start_database()
    stack.restart_worker()

    def all_finished() -> bool:
        stack.reap()
        rows = stack.sql("SELECT status FROM documents WHERE id = ANY(%s::uuid[])", accepted)
        return len(rows) == len(accepted) and all(status in ("completed", "failed") for (status,) in rows)

    wait_for(all_finished, timeout=240, interval=3, what="every accepted upload to reach a terminal state")
    documents = [stack.document(document_id) for document_id in accepted]
    assert [d["status"] for d in documents] == ["completed"] * len(accepted), stack.logs()
    assert all(d["chunk_count"] > 0 for d in documents)
    # 每份文档的分块恰好一组：没有两个 worker 各写一份
    counts = dict(stack.sql("SELECT document_id::text, count(*) FROM document_chunks "
                            "WHERE document_id = ANY(%s::uuid[]) GROUP BY document_id", accepted))
    assert counts == {d["id"]: d["chunk_count"] for d in documents}
    assert not stack.sql("SELECT 1 FROM jobs WHERE target_id = ANY(%s::uuid[]) AND lease_owner <> ''", accepted)
