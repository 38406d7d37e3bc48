"""worker 侧的故障：数据库在入库时断开、租约被收回、停止信号下的检查点、embedding 提供方出错/挂起/输出畸形、
磁盘写满、快慢队列的分流，以及 qcluster / serve 的进程生命周期。都在本进程内完成，几秒钟跑完；真正停掉数据库、
SIGKILL worker 的端到端场景见 tests/ops/test_fault_injection.py。"""

from __future__ import annotations

import contextlib
import errno
import io
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.db import OperationalError
from django_q.models import Schedule

from documents import ingestion
from documents.ingestion import ingestion_submit
from documents.models import Document, DocumentChunk
from documents.services import document_upload
from infra.workers import request_stop, reset_stop
from jobs.models import Job
from jobs.runner import reap, run_job
from raglib.providers.embedding import get_embedding_provider
from tests.conftest import assert_error
from tests.documents.test_api import BID_TEXT, upload
from tests.job_helpers import job_of, run_again
from tests.raglib.test_embedding_providers import FakeEmbeddingServer

pytestmark = pytest.mark.process


def _uploaded(kb, run_on_commit, text: str = BID_TEXT, name: str = "a.md") -> Document:
    document = run_on_commit(document_upload, kb=kb, filename=name, upload=io.BytesIO(text.encode()),
                             metadata={}, chunking={})
    return Document.objects.get(pk=document.pk)


# ---------------------------------------------------------------- 数据库在入库时断开


def test_store_step_losing_the_database_retries_and_keeps_the_embeddings(kb_factory, run_on_commit,
                                                                         fake_embedder, monkeypatch, settings):
    real_copy = ingestion.copy_chunks
    calls = {"copy": 0}

    def copy_then_lose_connection(*args: Any, **kwargs: Any) -> None:
        calls["copy"] += 1
        if calls["copy"] == 1:
            # 驱动的原话带着 socket 路径：不该出现在 error_message 里
            raise OperationalError('connection to server on socket "/tmp/.s.PGSQL.5432" failed: server closed '
                                   "the connection unexpectedly")
        real_copy(*args, **kwargs)

    monkeypatch.setattr(ingestion, "copy_chunks", copy_then_lose_connection)
    kb = kb_factory()
    document = _uploaded(kb, run_on_commit)
    job = job_of(document)
    assert document.status == "processing" and document.attempts == 1
    assert document.error_message == ("Saving chunks to the database failed: The database connection was lost "
                                      "(attempt 1; retrying in 30 s)")
    assert job.lease_owner == "" and job.status == "queued" and document.stage == ""
    schedule = Schedule.objects.get(name__startswith=f"job:{job.id}:1:")
    assert schedule.next_run == document.next_retry_at and schedule.cluster == "ragservice-fast"
    embedded = sum(fake_embedder.calls)
    assert embedded > 0
    assert (settings.DATA_DIR / "files" / str(kb.id) / f"{document.id}.vectors.npz").exists()

    run_again(job)
    document.refresh_from_db()
    assert document.status == "completed" and document.error_message == ""
    assert sum(fake_embedder.calls) == embedded  # 第二次尝试一个向量也没重算
    assert DocumentChunk.objects.filter(document=document).count() == document.chunk_count > 0
    assert not (settings.DATA_DIR / "files" / str(kb.id) / f"{document.id}.vectors.npz").exists()


# ---------------------------------------------------------------- 租约


def test_document_leased_by_a_live_worker_is_skipped(kb_factory, fake_embedder, settings):
    from django.utils import timezone

    kb = kb_factory()
    document = Document.objects.create(knowledge_base=kb, filename="x.md")
    job = Job.objects.create(kind="ingest", target_id=document.pk, queue=settings.FAST_QUEUE, status="running",
                             lease_owner="someone-else", lease_expires_at=timezone.now() + timedelta(minutes=1))
    run_job(str(job.id))
    job.refresh_from_db()
    assert job.attempt == 0 and job.lease_owner == "someone-else" and not fake_embedder.calls


def test_lease_reclaimed_mid_ingestion_discards_the_result(kb_factory, run_on_commit, fake_embedder, monkeypatch):
    """回收器在 embed 之后收回了租约（别的 worker 在接手）：提交时核对令牌失败，什么都不写。"""
    real_embed = ingestion.embed_step

    def embed_then_lose_lease(run, drafts, provider):
        vectors = real_embed(run, drafts, provider)
        Job.objects.filter(pk=run.job.job.pk).update(lease_owner="the-next-worker")
        return vectors

    monkeypatch.setattr(ingestion, "embed_step", embed_then_lose_lease)
    document = _uploaded(kb_factory(), run_on_commit)
    assert document.status == "processing" and document.error_message == ""
    assert job_of(document).lease_owner == "the-next-worker" and job_of(document).status == "running"
    assert not DocumentChunk.objects.filter(document=document).exists()


# ---------------------------------------------------------------- 优雅停止（真实进程里的停止见 test_graceful_stop.py）


@pytest.fixture
def stopping() -> Iterator[Callable[[], None]]:
    """调用它模拟本 worker 收到停止信号（infra.workers.request_stop）；测试结束时撤销。"""
    yield request_stop
    reset_stop()


@pytest.fixture
def requeued(monkeypatch) -> list[tuple[Any, ...]]:
    """截获入队：(函数, 位置参数, 关键字参数)。"""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr("django_q.tasks.async_task", lambda func, *args, **kwargs: calls.append((func, args, kwargs)))
    return calls


def _sections(count: int) -> str:
    paragraph = "投标人须具备相应资质，投标文件应包括商务部分和技术部分。"
    return "\n\n".join(f"## 第{i}节\n\n第{i}节：{paragraph}" for i in range(count))


def test_task_received_while_stopping_goes_back_untouched(kb_factory, fake_embedder, stopping, requeued,
                                                         django_capture_on_commit_callbacks):
    """停止途中才交到手上的任务（本地队列里的、重投递的）：不开始，原样（同一尝试号、同一队列）放回。"""
    document = Document.objects.create(knowledge_base=kb_factory(), filename="a.md", size_bytes=10)
    job = ingestion_submit(document, push=False)
    Job.objects.filter(pk=job.pk).update(attempt=2)
    stopping()
    with django_capture_on_commit_callbacks(execute=True):
        run_job(str(job.id))
    job.refresh_from_db()
    assert (job.status, job.attempt, job.lease_owner) == ("queued", 2, "") and not fake_embedder.calls
    assert requeued == [(ingestion.INGEST_TASK_FUNC, (str(job.id),),
                         {"cluster": "ragservice-fast", "request_id": None})]


def test_stop_mid_embed_sets_the_attempt_aside_and_keeps_its_vectors(kb_factory, run_on_commit, fake_embedder,
                                                                     stopping, requeued, settings, monkeypatch,
                                                                     django_capture_on_commit_callbacks):
    """embed 途中收到停止信号：下一个检查点（片与片之间）放下这次尝试——已算好的向量暂存、交还租约、同一尝试号
    重新入队，不算失败也不算 worker 死亡；服务再起来时接着做，一个向量也不重算。"""
    settings.EMBEDDING_BATCH_SIZE = 2  # 每片 2 条
    kb = kb_factory(chunking={"strategy": "token", "chunk_size": 32, "overlap": 0})
    document = _uploaded(kb, run_on_commit, text=_sections(6))  # 入队被截获，还没有执行
    real_embed = fake_embedder.embed_documents

    def embed_then_stop(texts: list[str]) -> Any:
        vectors = real_embed(texts)
        if len(fake_embedder.calls) == 2:
            stopping()  # 第二片算完时收到停止信号
        return vectors

    monkeypatch.setattr(fake_embedder, "embed_documents", embed_then_stop)
    job = job_of(document)
    with django_capture_on_commit_callbacks(execute=True):
        run_job(str(job.id))
    document.refresh_from_db()
    job.refresh_from_db()
    assert document.status == "processing" and document.error_message == "" and document.stage == ""
    # 尝试号原样（放下的这次不算），租约交还，不算 worker 死亡
    assert (job.status, job.attempt, job.lease_owner, job.worker_deaths) == ("queued", 0, "", 0)
    assert not DocumentChunk.objects.filter(document=document).exists()
    assert requeued[-1] == (ingestion.INGEST_TASK_FUNC, (str(job.id),),
                            {"cluster": "ragservice-fast", "request_id": None})
    assert reap(stale_after=timedelta(minutes=5)) == []  # 租约已交还：回收器没有什么可收
    assert fake_embedder.calls == [2, 2]
    stash = settings.DATA_DIR / "files" / str(kb.id) / f"{document.id}.vectors.npz"
    assert stash.exists()

    reset_stop()
    run_job(str(job.id))  # 服务再起来，接着做
    document.refresh_from_db()
    job.refresh_from_db()
    assert document.status == "completed" and (job.status, job.attempt, job.worker_deaths) == ("completed", 1, 0)
    assert DocumentChunk.objects.filter(document=document).count() == document.chunk_count > 4
    assert sum(fake_embedder.calls) == document.chunk_count  # 暂存的 4 个向量没有重算
    assert not stash.exists()


def test_parser_ended_by_the_stop_is_not_the_files_fault(kb_factory, run_on_commit, fake_embedder, stopping,
                                                         requeued, monkeypatch, django_capture_on_commit_callbacks):
    """停止信号也结束了解析子进程：解析“失败”不是文件的错，文档不置为失败，原样重新入队。"""
    from documents.sandbox import SandboxFailure

    def parser_ended_by_the_stop(*args: Any, **kwargs: Any) -> Any:
        stopping()
        raise SandboxFailure("The parser process stopped unexpectedly (exit code -15)")

    monkeypatch.setattr(ingestion, "parse_isolated", parser_ended_by_the_stop)
    document = _uploaded(kb_factory(), run_on_commit)
    job = job_of(document)
    with django_capture_on_commit_callbacks(execute=True):
        run_job(str(job.id))
    document.refresh_from_db()
    job.refresh_from_db()
    assert document.status == "processing" and document.error_message == ""
    assert (job.status, job.attempt, job.lease_owner) == ("queued", 0, "")
    assert requeued[-1][1] == (str(job.id),) and not fake_embedder.calls


# ---------------------------------------------------------------- embedding 提供方出错、挂起、输出畸形


@pytest.fixture
def http_embedder(monkeypatch) -> Any:
    with FakeEmbeddingServer() as server:
        provider = get_embedding_provider(server.config(timeout=0.3, batch_size=64))
        monkeypatch.setattr(ingestion, "embedder", lambda provider_name, model: provider)
        yield server


@pytest.mark.parametrize(("fault", "message", "transient"), [
    ("hang", "timed out", True),
    ("malformed", "unexpected OpenAI response", True),
    ("raise", "input rejected", False),
])
def test_provider_faults_end_in_retry_or_failure_with_a_message(kb_factory, run_on_commit, http_embedder,
                                                                fault, message, transient):
    if fault == "hang":
        http_embedder.delay = 1.0  # 超过 0.3 s 的超时
    elif fault == "malformed":
        http_embedder.fail_status, http_embedder.fail_body = 200, {"unexpected": True}
    else:
        http_embedder.fail_status, http_embedder.fail_body = 400, {"error": "input rejected"}
    document = _uploaded(kb_factory(), run_on_commit)
    assert document.error_message.startswith("Computing embeddings failed")
    if transient:
        assert document.status == "processing" and "retrying in 30 s" in document.error_message
        assert message in document.error_message
    else:
        assert document.status == "failed" and message in document.error_message
    assert not DocumentChunk.objects.filter(document=document).exists()


# ---------------------------------------------------------------- 磁盘写满


def test_disk_full_while_storing_an_upload_is_a_clear_error_and_leaves_nothing(client_rw, kb_factory, settings,
                                                                               monkeypatch):
    from documents import services

    real_open = Path.open

    def open_then_fill_disk(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(self, mode, *args, **kwargs)
        if "w" in mode and self.name.endswith(".partial"):
            handle.write(b"half of the file")

            def full(data: bytes) -> int:
                raise OSError(errno.ENOSPC, "No space left on device")

            handle.write = full  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(services.Path, "open", open_then_fill_disk)
    kb = kb_factory()
    response = upload(client_rw, kb, "a.md", BID_TEXT.encode())
    error = assert_error(response, 503, "SERVICE_UNAVAILABLE")
    assert error["details"][0]["code"] == "STORAGE_FULL" and response["Retry-After"]
    assert not Document.objects.exists()
    files = settings.DATA_DIR / "files" / str(kb.id)
    assert not files.exists() or not any(files.iterdir())  # 半截文件已删掉


# ---------------------------------------------------------------- 队列公平：分流


def test_small_uploads_and_cleanup_go_to_the_fast_queue(client_rw, kb_factory, run_on_commit, settings,
                                                        monkeypatch):
    queued: list[tuple[str, Any]] = []
    monkeypatch.setattr("django_q.tasks.async_task", lambda func, *args, **kwargs: queued.append(
        (func, kwargs.get("cluster"))))
    settings.FAST_QUEUE_MAX_BYTES = 1000
    kb = kb_factory()
    upload(client_rw, kb, "small.md", b"# small\n\nshort text", run_on_commit)
    upload(client_rw, kb, "large.md", BID_TEXT.encode() * 10, run_on_commit)
    run_on_commit(client_rw.delete, f"/knowledge_bases/{kb.id}")
    assert queued == [("documents.tasks.run_ingestion", "ragservice-fast"),
                      ("documents.tasks.run_ingestion", "ragservice"),
                      ("ops.tasks.run_cleanup", "ragservice-fast")]


def test_reaper_requeues_jobs_nobody_started(kb_factory, monkeypatch, settings, run_on_commit):
    """worker 取走消息后、开始处理前被杀（或 Redis 的消息丢了）：作业没有租约，交给队列久了就再交一次。"""
    from django.utils import timezone

    queued: list[tuple[Any, ...]] = []
    monkeypatch.setattr("django_q.tasks.async_task", lambda *args, **kwargs: queued.append((args, kwargs)))
    kb = kb_factory()
    long_ago = timezone.now() - timedelta(minutes=10)

    def job(name: str, **fields: Any) -> Job:
        document = Document.objects.create(knowledge_base=kb, filename=name)
        return Job.objects.create(kind="ingest", target_id=document.pk, queue=settings.FAST_QUEUE, **fields)

    forgotten = job("a.md", attempt=1, pushed_at=long_ago)
    job("b.md", pushed_at=timezone.now())  # 刚交给队列
    job("c.md", attempt=1, pushed_at=long_ago, run_after=timezone.now() + timedelta(minutes=1))  # 在等重试
    migrated = job("d.md")  # 升级迁移建的作业：从没交给过队列
    assert sorted(run_on_commit(reap, stale_after=timedelta(minutes=5))) == sorted([str(forgotten.id),
                                                                                    str(migrated.id)])
    assert {args[1] for args, _ in queued} == {str(forgotten.id), str(migrated.id)}
    # pushed_at 已刷新：下一分钟不会再交
    assert reap(stale_after=timedelta(minutes=5)) == []


def test_reaper_schedule_runs_on_the_fast_queue(db):
    assert Schedule.objects.get(name="ops.reap_stale_tasks").cluster == "ragservice-fast"


# ---------------------------------------------------------------- 进程生命周期


def test_qcluster_also_starts_and_stops_the_fast_queue_cluster(monkeypatch):
    from django.core.management import load_command_class
    from django_q.management.commands.qcluster import Command as QclusterCommand

    started: list[dict[str, str]] = []

    class FakeChild:
        def __init__(self, args: list[str], env: dict[str, str], **kwargs: Any) -> None:
            started.append(env)
            self.signals: list[int] = []

        def poll(self) -> None:
            return None

        def send_signal(self, signum: int) -> None:
            self.signals.append(signum)

        def wait(self, timeout: float | None = None) -> int:
            return 0

    children: list[FakeChild] = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **kw: children.append(FakeChild(*a, **kw)) or children[-1])
    monkeypatch.setattr(QclusterCommand, "handle", lambda self, *args, **options: None)
    # 不在测试进程里装 worker 的信号处理与转发（那是 qcluster 进程自己的事）
    monkeypatch.setattr("ops.management.commands.qcluster.starting_cluster",
                        lambda workers: contextlib.nullcontext())
    load_command_class("ops", "qcluster").handle(no_fast_queue=False)
    assert [env["Q_CLUSTER_NAME"] for env in started] == ["ragservice-fast"]
    assert children[0].signals == [signal.SIGTERM]  # 主集群停了，快队列集群跟着停


def test_stop_groups_kills_grandchildren_that_ignore_sigterm(tmp_path):
    """serve 停止子进程：SIGTERM 整个进程组，限时等待，忽略 SIGTERM 的孙进程被 SIGKILL，不留孤儿。"""
    from ops.management.commands.serve import group_alive, stop_groups

    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import os, signal, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    started = time.monotonic()
    stop_groups([leader], timeout=1.0)
    assert time.monotonic() - started < 10
    assert leader.poll() is not None
    assert not group_alive(leader.pid)  # 忽略 SIGTERM 的孙进程也没了（至多剩下等人收尸的僵尸）
    with contextlib.suppress(psutil.NoSuchProcess):
        assert psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_group_alive_skips_a_process_that_exits_while_it_is_listed(monkeypatch):
    """列举进程之后、读 pgid 之前退出的进程：os.getpgid 抛 ProcessLookupError，group_alive 跳过它而不是抛出
    （CI 上 stop_groups 因此失败过一次）。"""
    from ops.management.commands import serve

    def gone(pid: int) -> int:
        raise ProcessLookupError(pid)

    monkeypatch.setattr(serve.os, "getpgid", gone)
    assert serve.group_alive(1) is False
