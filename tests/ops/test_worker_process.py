"""真实 django-q2 worker 子进程：清理或摄取途中 SIGKILL worker，任务仍能完成（摄取的重试再被优雅停止也一样）；
/ready 反映 worker 在线与否。"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from django_q.conf import Conf

from infra.principal import SYSTEM_PRINCIPAL
from jobs.runner import reap
from knowledge.models import CleanupTask
from knowledge.services import knowledge_base_delete
from tests.factories import add_documents
from tests.job_helpers import job_of
from tests.workers import WorkerCluster, wait_for

pytestmark = [pytest.mark.process, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _progress(task_id) -> CleanupTask:
    return CleanupTask.objects.get(pk=task_id)


def test_cleanup_survives_worker_kill(kb_factory, tmp_path, monkeypatch):
    monkeypatch.setattr(Conf, "SYNC", False)  # 入队到 ORM broker，由子进程 worker 执行
    kb = kb_factory()
    total = add_documents(kb, documents=4, chunks_per_document=50)
    slow = {"RAG_CLEANUP_BATCH_SIZE": "10", "RAG_CLEANUP_BATCH_PAUSE_MS": "150"}
    first = WorkerCluster(tmp_path / "worker1.log", **slow).start()
    try:
        task = knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)  # 提交后入队（ORM broker）
        wait_for(lambda: _progress(task.id).processed >= 30, timeout=60, what="cleanup progress")
        first.kill()
    finally:
        first.stop()
    killed_at = _progress(task.id)
    assert killed_at.status == "running"
    assert 0 < killed_at.processed < total, first.log()

    job = job_of(task)
    assert job.status == "running" and job.lease_owner != ""  # 被杀的 worker 来不及交还租约
    second = WorkerCluster(tmp_path / "worker2.log", **slow).start()
    try:
        # 回收器：租约过期未续的作业放回它自己的（快）队列，记一次 worker 死亡
        lease = int(first.env["RAG_TASK_LEASE_SECONDS"])
        wait_for(lambda: reap(stale_after=timedelta(minutes=5)) == [str(job.id)], timeout=lease * 3,
                 what="reaper to requeue the orphaned job")
        wait_for(lambda: _progress(task.id).status == "completed", timeout=90, what="cleanup completion")
    finally:
        second.stop()
    done = _progress(task.id)
    assert done.processed == done.total == total, second.log()  # 续跑不重复计数
    job.refresh_from_db()
    assert (job.status, job.attempt, job.worker_deaths, job.queue) == ("completed", 2, 1, "ragservice-fast")


def test_ready_reports_worker_presence(db, tmp_path, monkeypatch):
    monkeypatch.setattr(Conf, "SYNC", False)
    client = Client()
    response = client.get("/ready")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "SERVICE_UNAVAILABLE"
    assert [d["field"] for d in error["details"]] == ["worker"]

    cluster = WorkerCluster(tmp_path / "worker.log").start()
    try:
        wait_for(lambda: client.get("/ready").status_code == 200, timeout=60, what="/ready to turn 200")
    finally:
        cluster.stop()
    checks = client.get("/ready")
    # 停止后心跳随缓存过期消失；这里只断言运行期间的结果
    assert checks.status_code in (200, 503)


def test_ingestion_survives_worker_kill(kb_factory, tmp_path, monkeypatch):
    """大文件（> 1 MB，主队列）摄取到 embed 阶段时 SIGKILL worker：租约一到期回收器就把它放回主队列（计一次 worker
    死亡、尝试号 + 1），新 worker 接着做；这一次在 embed 途中被优雅停止（SIGTERM，宽限期后 SIGKILL，与
    ``manage.py serve`` 停止时相同）：交还租约、同一尝试号放回主队列，不再记 worker 死亡（以前它在这里被判成“有害文件”，
    置为 failed 且不再重试）。第三个 worker 完成它，分块恰好一组。embedding 用慢服务（tests/ops/slow_embedding.py）。"""
    from django_q.models import OrmQ
    from django_q.signing import SignedPackage

    from documents.ingestion import ingestion_queue
    from documents.models import Document, DocumentChunk
    from jobs.models import Job
    from ops.management.commands.serve import STOP_SECONDS
    from tests.ops.slow_embedding import SlowEmbeddingServer, graceful_stop, sections, slow_kb, upload

    def row() -> Document:
        return Document.objects.get(pk=document.pk)

    def job() -> Job:
        return job_of(document)

    def queued_on() -> list[str]:
        """这个文档的作业还没被取走的消息在哪个队列。"""
        return [task.key for task in OrmQ.objects.filter(lock__lte=timezone.now())
                if SignedPackage.loads(task.payload)["args"] == (str(job().pk),)]

    monkeypatch.setattr(Conf, "SYNC", False)
    with SlowEmbeddingServer(delay=0.25) as server:
        kb = slow_kb(kb_factory, chunk_size=1024)
        env = server.worker_env()
        first = WorkerCluster(tmp_path / "worker1.log", **env).start()
        try:
            document = upload(kb, "big.md", sections(2800))
            assert document.size_bytes > 1024 * 1024 and ingestion_queue(document) == "ragservice"  # 主队列
            wait_for(lambda: row().stage == "embed", timeout=120, interval=0.05,
                     what="ingestion to reach the embed stage")
            first.kill()
            killed_at = time.monotonic()
        finally:
            first.stop()
        killed = row()
        assert killed.status == "processing" and killed.stage == "embed", first.log()
        assert job().lease_owner != ""  # 被杀的 worker 来不及交还
        assert not DocumentChunk.objects.filter(document=killed).exists()  # 半截结果从不可见

        lease = int(first.env["RAG_TASK_LEASE_SECONDS"])
        wait_for(lambda: reap(stale_after=timedelta(minutes=5)) == [str(job().pk)], timeout=lease * 3,
                 interval=0.2, what="reaper to requeue the orphaned document")
        assert time.monotonic() - killed_at < lease + 2  # 租约一过期就收回
        assert queued_on() == ["ragservice"]  # 回到它自己的（主）队列
        reaped = job()
        assert (reaped.worker_deaths, reaped.status, reaped.attempt) == (1, "queued", 1)
        assert row().status == "processing" and row().stage == ""

        second = WorkerCluster(tmp_path / "worker2.log", **env).start()
        try:
            wait_for(lambda: job().attempt == 2 and row().stage == "embed", timeout=120, interval=0.05,
                     what="the retry to reach the embed stage")
            seconds = graceful_stop(second)
        finally:
            second.stop()
        assert seconds < STOP_SECONDS, second.log()[-3000:]  # 在宽限期内自己停下，没有等到 SIGKILL
        stopped = job()
        assert (row().status, stopped.worker_deaths, stopped.attempt) == ("processing", 1, 1), second.log()
        assert stopped.lease_owner == "" and stopped.status == "queued" and row().stage == ""
        assert reap(stale_after=timedelta(minutes=5)) == []  # 不是死亡：回收器没什么可收
        assert queued_on() == ["ragservice"]

        third = WorkerCluster(tmp_path / "worker3.log", **env).start()
        try:
            wait_for(lambda: row().status != "processing", timeout=180, what="ingestion to reach a terminal state")
        finally:
            third.stop()
    done = row()
    assert done.status == "completed", (done.error_message, third.log()[-3000:])
    assert (job().status, job().attempt, job().worker_deaths) == ("completed", 2, 1)
    assert done.chunk_count == DocumentChunk.objects.filter(document=done).count() > 200


def test_cleanup_outlives_the_cluster_timeout_under_the_maintenance_timeout(kb_factory, tmp_path, monkeypatch,
                                                                            settings):
    """真实 worker：集群超时（RAG_TASK_TIMEOUT）只有 10 秒，清理跑得更久也不被杀——它按入队时带上的
    RAG_MAINTENANCE_TIMEOUT 计时，一次尝试做完。"""
    monkeypatch.setattr(Conf, "SYNC", False)
    settings.MAINTENANCE_TIMEOUT = 120
    kb = kb_factory()
    total = add_documents(kb, documents=4, chunks_per_document=50)
    slow = {"RAG_TASK_TIMEOUT": "10", "RAG_CLEANUP_BATCH_SIZE": "5", "RAG_CLEANUP_BATCH_PAUSE_MS": "400"}
    cluster = WorkerCluster(tmp_path / "worker.log", **slow).start()
    try:
        task = knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)
        wait_for(lambda: _progress(task.id).status == "completed", timeout=90, what="cleanup completion")
    finally:
        cluster.stop()
    done = _progress(task.id)
    assert done.processed == done.total == total and done.attempts == 1, cluster.log()
    assert job_of(done).worker_deaths == 0
    assert done.started_at and done.finished_at
    ran = (done.finished_at - done.started_at).total_seconds()
    print(f"cleanup of {total} rows ran {ran:.1f} s under a 10 s cluster timeout")
    assert ran > 13, "清理没有跑过集群超时（加 3 秒缓冲），测不出什么"
    assert "after timeout" not in cluster.log()
