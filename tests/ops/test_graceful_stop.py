"""真实 qcluster 进程：停止服务不是 worker 死亡（GRACEFUL-STOP-NOT-A-DEATH），空闲的 worker 帮着做别人的活
（IDLE-WORKER-TAKES-WORK）。

embedding 用 ``tests.ops.slow_embedding`` 的慢服务（每个请求 0.25 秒），摄取在 embed 阶段停留的时间可控。
SIGKILL 之后回收器接手、再被优雅停止的那一条见 tests/ops/test_worker_process.py::test_ingestion_survives_worker_kill。
"""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest
from django_q.conf import Conf
from django_q.models import Task

from documents.ingestion import INGEST_TASK_FUNC, ingestion_queue
from documents.models import Document, DocumentChunk
from jobs.models import Job
from jobs.runner import reap
from ops.management.commands.serve import STOP_SECONDS
from tests.job_helpers import job_of
from tests.ops.slow_embedding import SlowEmbeddingServer, graceful_stop, sections, slow_kb, upload, warm_workers
from tests.workers import WorkerCluster, wait_for

pytestmark = [pytest.mark.process, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SMALL = {"strategy": "token", "chunk_size": 64, "overlap": 0}


def _rows(documents: list[Document]) -> list[Document]:
    return list(Document.objects.filter(pk__in=[d.pk for d in documents]).order_by("filename"))


def _in_embed(documents: list[Document]) -> bool:
    return any(d.stage == "embed" for d in _rows(documents))


def _jobs(documents: list[Document]) -> list[Job]:
    return [job_of(document) for document in documents]


def _assert_set_aside(documents: list[Document], log: str) -> None:
    """停止之后：没有文档失败，作业没有留下租约，没有记 worker 死亡；回收器没有什么可收。"""
    rows = _rows(documents)
    assert all(d.status in ("processing", "completed") for d in rows), [(d.filename, d.error_message) for d in rows]
    jobs = _jobs(documents)
    assert [j.lease_owner for j in jobs] == [""] * len(jobs), log[-3000:]
    assert [j.worker_deaths for j in jobs] == [0] * len(jobs)
    assert reap(stale_after=timedelta(minutes=5)) == []
    assert "job_requeued_worker_stopping" in log, log[-3000:]


def test_two_service_stops_mid_ingestion_lose_nothing_and_count_no_deaths(kb_factory, tmp_path, monkeypatch):
    """一个大文件（主队列）与三个小文件（快队列）摄取途中，服务停了两次：第一次 SIGTERM 整个进程组（serve、systemd），
    第二次只给 qcluster 进程（容器里的 PID 1）。两次都在宽限期内自己退出，手上的文档交还租约、原样重新入队；
    第三次启动后每个答了 202 的文档都完成，分块恰好一组，尝试号仍是 1，没有记 worker 死亡。"""
    monkeypatch.setattr(Conf, "SYNC", False)
    with SlowEmbeddingServer(delay=0.25) as server:
        kb = slow_kb(kb_factory, chunk_size=1024)
        env = server.worker_env()
        first = WorkerCluster(tmp_path / "worker1.log", **env).start()
        try:
            documents = [upload(kb, "big.md", sections(2800))]
            documents += [upload(kb, f"small-{i}.md", sections(60, tag=f"{i}-"), **SMALL) for i in range(3)]
            assert [ingestion_queue(d) for d in documents] == ["ragservice"] + ["ragservice-fast"] * 3
            wait_for(lambda: _in_embed(documents), timeout=120, interval=0.05, what="a document in embed")
            seconds = graceful_stop(first)
        finally:
            first.stop()
        assert seconds < STOP_SECONDS / 2, first.log()[-3000:]
        _assert_set_aside(documents, first.log())

        second = WorkerCluster(tmp_path / "worker2.log", **env).start()
        try:
            wait_for(lambda: _in_embed(documents), timeout=120, interval=0.05, what="a document in embed again")
            seconds = graceful_stop(second, whole_group=False)
        finally:
            second.stop()
        assert seconds < STOP_SECONDS / 2, second.log()[-3000:]
        _assert_set_aside(documents, second.log())

        third = WorkerCluster(tmp_path / "worker3.log", **env).start()
        try:
            wait_for(lambda: all(d.status == "completed" for d in _rows(documents)), timeout=180,
                     what="every document to complete")
        finally:
            third.stop()
    done = _rows(documents)
    assert [(j.status, j.attempt, j.worker_deaths) for j in _jobs(documents)] == [("completed", 1, 0)] * len(done)
    for document in done:
        # 恰好一组分块：数量等于 chunk_count，序号不重复
        indexes = list(DocumentChunk.objects.filter(document=document).values_list("chunk_index", flat=True))
        assert len(indexes) == len(set(indexes)) == document.chunk_count > 0, document.filename


def _intervals(tasks: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return sorted((task["started"], task["stopped"]) for task in tasks)


def test_idle_main_worker_takes_small_uploads_beside_a_long_one(kb_factory, tmp_path, monkeypatch):
    """主队列 2 个 worker、快队列 1 个。一个长文档占着主队列的一个 worker 时，另一个主队列 worker 不再闲着：
    它与快队列的 worker 一起做 6 个小文件（同时在做的小文件有两个），小文件全部在长文档之前完成；
    快队列的 worker 从不碰长文档。"""
    monkeypatch.setattr(Conf, "SYNC", False)
    with SlowEmbeddingServer(delay=0.25) as server:
        kb = slow_kb(kb_factory, chunk_size=512)
        cluster = WorkerCluster(tmp_path / "worker.log", **server.worker_env(RAG_QUEUE_WORKERS="2")).start()
        try:
            wait_for(lambda: warm_workers(cluster) == 3, timeout=120, what="all three workers to be warm")
            long = upload(kb, "long.md", sections(2800))
            wait_for(lambda: Document.objects.get(pk=long.pk).stage == "embed", timeout=120, interval=0.1,
                     what="the long document to reach embed")
            small = [upload(kb, f"small-{i}.md", sections(60, tag=f"{i}-"), **SMALL) for i in range(6)]
            wait_for(lambda: all(d.status == "completed" for d in _rows(small)), timeout=120,
                     what="the small uploads to complete")
            long_then = Document.objects.get(pk=long.pk)
            ids = {str(job_of(d).pk) for d in small}
            wait_for(lambda: Task.objects.filter(func=INGEST_TASK_FUNC).count() >= len(small), timeout=30,
                     what="the task results to be saved")
            tasks = [t for t in Task.objects.filter(func=INGEST_TASK_FUNC).values("args", "cluster", "started",
                                                                                  "stopped")]
        finally:
            cluster.stop()
    small_tasks = [t for t in tasks if t["args"][0] in ids]
    assert len(small_tasks) == len(small), cluster.log()[-3000:]
    # 长文档还在做，或者在所有小文件之后才完成
    assert long_then.status == "processing" or long_then.finished_at > max(d.finished_at for d in _rows(small))
    assert {t["cluster"] for t in small_tasks} == {"ragservice", "ragservice-fast"}, small_tasks
    assert all(t["cluster"] == "ragservice" for t in tasks if t["args"][0] == str(job_of(long).pk))
    spans = _intervals(small_tasks)
    assert any(later[0] < earlier[1] for earlier, later in pairwise(spans)), spans
