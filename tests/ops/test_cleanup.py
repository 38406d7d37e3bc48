"""异步级联清理的进度、幂等续跑、自动重试与人工重试。

对应 docs/INVARIANTS.md 的 CLEANUP-RESUMABLE、CLEANUP-RETRY、CLEANUP-PROGRESS、IDEMPOTENT-TASKS。"""

from __future__ import annotations

import ast
import os
import uuid
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone
from django_q.models import Schedule

from documents.models import Document, DocumentChunk
from jobs.models import Job
from jobs.runner import reap
from knowledge.models import CleanupTask, KnowledgeBase
from knowledge.services import cleanup_submit
from ops import cleanup
from ops.tasks import run_cleanup
from tests.factories import add_documents

pytestmark = pytest.mark.django_db
REAL_DELETE_BATCH = cleanup.delete_batch


def _delete(client, kb, run_on_commit) -> CleanupTask:
    response = run_on_commit(client.delete, f"/knowledge_bases/{kb.id}")
    assert response.status_code == 202
    return CleanupTask.objects.get(pk=response.json()["cleanup_task_id"])


def test_cleanup_deletes_everything_and_reports_progress(client_rw, kb_factory, run_on_commit, settings):
    settings.CLEANUP_BATCH_SIZE = 7
    kb = kb_factory()
    other = kb_factory()
    total = add_documents(kb, documents=3, chunks_per_document=10)
    add_documents(other, documents=1, chunks_per_document=5)
    files = cleanup.knowledge_base_files_dir(kb.id)
    files.mkdir(parents=True)
    (files / "original.pdf").write_bytes(b"%PDF")
    finished = Job.objects.create(kind="ingest", target_id=Document.objects.filter(knowledge_base=kb).first().pk,
                                  knowledge_base_id=kb.id, queue="ragservice-fast", status="completed")

    task = _delete(client_rw, kb, run_on_commit)

    body = client_rw.get(f"/cleanup_tasks/{task.id}").json()
    assert body["status"] == "completed"
    assert body["progress"] == {"processed": total, "total": total, "percentage": 1.0}
    assert body["error_message"] is None
    assert not Document.objects.filter(knowledge_base=kb).exists()
    assert not DocumentChunk.objects.filter(knowledge_base=kb).exists()
    assert not files.exists()
    # 其他知识库不受影响；被删除的知识库行保留供审计
    assert DocumentChunk.objects.filter(knowledge_base=other).count() == 5
    assert KnowledgeBase.objects.get(pk=kb.pk).status == "deleted"
    # 文档的作业记录随知识库一并删掉，只留下清理作业自己
    assert not Job.objects.filter(pk=finished.pk).exists()
    assert list(Job.objects.filter(knowledge_base_id=kb.id).values_list("kind", "status")) == [("cleanup", "completed")]


def test_symlinked_file_folder_loses_its_files_and_nothing_else(client_rw, kb_factory, run_on_commit, settings,
                                                                 tmp_path):
    """知识库目录是指向数据目录以外的符号链接（issue #23：rmtree 拒绝链接、错误被忽略，文件留着却报告 completed）。

    链接目标里本知识库的文件（原始文件、暂存向量、半截的 .partial）被删掉，链接本身被删掉；不是本服务写下的文件、
    子目录、属于另一个知识库现存文档的文件原样留下。
    """
    kb, other = kb_factory(), kb_factory()
    add_documents(kb, documents=2, chunks_per_document=2)
    add_documents(other, documents=1, chunks_per_document=1)
    ours = [document.id for document in Document.objects.filter(knowledge_base=kb)]
    theirs = Document.objects.get(knowledge_base=other).id
    target = tmp_path / "elsewhere" / "big-volume"
    target.mkdir(parents=True)
    owned = [f"{ours[0]}.pdf", f"{ours[1]}.docx", f"{ours[1]}.vectors.npz", f"{uuid.uuid4()}.txt.partial"]
    for name in owned:
        (target / name).write_bytes(b"ours")
    foreign = ["notes.txt", f"{theirs}.pdf"]
    for name in foreign:
        (target / name).write_bytes(b"not ours")
    subfolder = target / str(uuid.uuid4())  # 名字像文档 id 的子目录：本服务从不建子目录，不碰
    subfolder.mkdir()
    (subfolder / "inside.txt").write_bytes(b"not ours")
    outside = tmp_path / "unrelated.pdf"
    outside.write_bytes(b"must survive")
    (target / f"{uuid.uuid4()}.pdf").symlink_to(outside)
    link = cleanup.knowledge_base_files_dir(kb.id)
    link.parent.mkdir(parents=True)
    link.symlink_to(target, target_is_directory=True)

    task = _delete(client_rw, kb, run_on_commit)

    body = client_rw.get(f"/cleanup_tasks/{task.id}").json()
    assert body["status"] == "completed", body
    assert not os.path.lexists(link)
    remaining = set(os.listdir(target))
    assert not remaining & set(owned)
    assert set(foreign) <= remaining and (subfolder / "inside.txt").exists()
    assert outside.read_bytes() == b"must survive"  # 目标里的链接只删链接本身，不跟随
    assert Document.objects.filter(pk=theirs).exists()


def test_link_into_another_knowledge_base_folder_deletes_only_the_link(client_rw, kb_factory, run_on_commit):
    """链接指向另一个知识库的目录：那里的文件（包括还没提交文档行的上传）一个都不删，只删链接。"""
    kb, other = kb_factory(), kb_factory()
    theirs = cleanup.knowledge_base_files_dir(other.id)
    theirs.mkdir(parents=True)
    uploading = theirs / f"{uuid.uuid4()}.pdf"  # 正在上传：文件已写入，文档行还没提交
    uploading.write_bytes(b"%PDF")
    link = cleanup.knowledge_base_files_dir(kb.id)
    link.symlink_to(theirs, target_is_directory=True)

    task = _delete(client_rw, kb, run_on_commit)

    task.refresh_from_db()
    assert task.status == "completed"
    assert not os.path.lexists(link) and uploading.exists()


def test_cleanup_is_not_completed_while_files_remain(client_rw, kb_factory, run_on_commit, monkeypatch):
    """原始文件删不掉（权限、只读挂载）是一次失败：照常排重试，不报告 completed，消息不带服务器上的绝对路径。"""
    kb = kb_factory()
    add_documents(kb, documents=1, chunks_per_document=1)
    files = cleanup.knowledge_base_files_dir(kb.id)
    files.mkdir(parents=True)
    (files / f"{uuid.uuid4()}.pdf").write_bytes(b"%PDF")
    real_rmtree = cleanup.shutil.rmtree

    def denied(path, ignore_errors=False, **kwargs):
        # 与真的 rmtree 一样：ignore_errors=True 时吞掉错误、文件留在原地
        if not ignore_errors:
            raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(cleanup.shutil, "rmtree", denied)
    task = _delete(client_rw, kb, run_on_commit)
    task = CleanupTask.objects.get(pk=task.pk)
    assert task.status == "running" and task.next_retry_at is not None
    assert "could not be deleted (Permission denied)" in task.error_message
    assert f"files/{kb.id}" in task.error_message and str(files) not in task.error_message
    assert files.exists()

    monkeypatch.setattr(cleanup.shutil, "rmtree", real_rmtree)
    _run_scheduled_retry(task)
    task.refresh_from_db()
    assert task.status == "completed" and not files.exists()


def test_empty_kb_cleanup_completes_with_zero_total(client_rw, kb_factory, run_on_commit):
    task = _delete(client_rw, kb_factory(), run_on_commit)
    body = client_rw.get(f"/cleanup_tasks/{task.id}").json()
    assert body["progress"] == {"processed": 0, "total": 0, "percentage": 1.0}


def _submitted(kb: KnowledgeBase) -> tuple[CleanupTask, Job]:
    """建清理任务并登记作业（测试事务不提交，作业不会交给队列，由测试自己执行）。"""
    task = CleanupTask.objects.create(knowledge_base=kb)
    return task, cleanup_submit(task)


def _expire_lease(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def test_interrupted_cleanup_resumes_without_double_counting(kb_factory, monkeypatch, settings):
    """worker 在批次之间死掉（SystemExit 不会被任务的异常处理捕获）：租约过期后回收器放回，
    续跑后 processed == total。"""
    settings.CLEANUP_BATCH_SIZE = 5
    monkeypatch.setattr("django_q.tasks.async_task", lambda *args, **kwargs: None)
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    total = add_documents(kb, documents=2, chunks_per_document=12)
    task, job = _submitted(kb)
    real_delete = cleanup.delete_batch
    calls = {"n": 0}

    def dying_delete(kb_id, batch_size):
        calls["n"] += 1
        if calls["n"] == 3:
            raise SystemExit("worker killed")
        return real_delete(kb_id, batch_size)

    monkeypatch.setattr(cleanup, "delete_batch", dying_delete)
    with pytest.raises(SystemExit):
        run_cleanup(str(job.id))
    task.refresh_from_db()
    assert task.status == "running"
    assert task.processed == 10 and task.total == total
    assert task.progress["percentage"] == round(10 / total, 4)

    monkeypatch.setattr(cleanup, "delete_batch", real_delete)
    run_cleanup(str(job.id))  # 代理重投递：作业还在运行（租约未过期），不会有第二个执行者
    assert CleanupTask.objects.get(pk=task.pk).processed == 10
    _expire_lease(job)
    assert reap(stale_after=timedelta(minutes=5)) == [str(job.id)]
    run_cleanup(str(job.id))  # 回收器放回队列的那一次
    task = CleanupTask.objects.get(pk=task.pk)
    assert task.status == "completed"
    assert task.processed == task.total == total
    assert task.attempts == 2 and task.job is not None and task.job.worker_deaths == 1
    run_cleanup(str(job.id))  # 再投递一次也不会改变任何东西
    task.refresh_from_db()
    assert task.processed == total


def _run_scheduled_retry(task: CleanupTask) -> Schedule:
    job = Job.objects.get(target_id=task.pk, status="queued")
    schedule = Schedule.objects.get(name__startswith=f"job:{job.id}:")
    assert schedule.func == "ops.tasks.run_cleanup" and schedule.cluster == "ragservice-fast"
    args = ast.literal_eval(schedule.args)
    kwargs = ast.literal_eval(schedule.kwargs)
    # django-q2 的选项（维护任务的超时），调度器入队时取出，不传给任务函数
    assert kwargs.pop("q_options") == {"timeout": django_settings.MAINTENANCE_TIMEOUT}
    schedule.delete()  # 相当于 django-q2 调度器到点取走这个一次性调度
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    run_cleanup(*args, **kwargs)
    return schedule


def test_three_automatic_retries_with_backoff_then_failed_then_manual_retry(
    client_rw, kb_factory, run_on_commit, monkeypatch
):
    kb = kb_factory()
    total = add_documents(kb, documents=2, chunks_per_document=3)

    def broken(kb_id, batch_size):
        raise RuntimeError("database is read-only")

    monkeypatch.setattr(cleanup, "delete_batch", broken)
    started = timezone.now()
    task = _delete(client_rw, kb, run_on_commit)

    expected_delays = [60, 120, 240]
    for attempt, delay in enumerate(expected_delays, start=1):
        task = CleanupTask.objects.get(pk=task.pk)
        assert task.status == "running" and task.attempts == attempt
        assert f"(attempt {attempt}; retrying in {delay} s)" in task.error_message
        assert "read-only" in task.error_message
        schedule = Schedule.objects.get(name__startswith=f"job:{task.job.id}:{attempt}:")
        assert schedule.schedule_type == Schedule.ONCE
        assert timedelta(seconds=delay - 5) < schedule.next_run - started < timedelta(seconds=delay + 30)
        assert task.next_retry_at == schedule.next_run
        body = client_rw.get(f"/cleanup_tasks/{task.id}").json()
        assert body["status"] == "running" and body["next_retry_at"] is not None
        started = timezone.now()
        _run_scheduled_retry(task)

    task = CleanupTask.objects.get(pk=task.pk)
    assert task.status == "failed" and task.attempts == 4 and task.job.status == "failed"
    assert not Schedule.objects.filter(name__startswith="job:").exists()
    body = client_rw.get(f"/cleanup_tasks/{task.id}").json()
    assert body["status"] == "failed" and "(gave up after 4 attempts)" in body["error_message"]
    assert body["attempts"] == 4 and body["next_retry_at"] is None

    # 故障排除后人工重试：重置为 pending，随后执行成功
    monkeypatch.setattr(cleanup, "delete_batch", REAL_DELETE_BATCH)
    response = run_on_commit(client_rw.post, f"/cleanup_tasks/{task.id}/retry")
    assert response.status_code == 202
    task = CleanupTask.objects.get(pk=task.pk)
    assert task.status == "completed" and task.attempts == 1  # 人工重试是新的作业，尝试次数从头算
    assert task.processed == task.total == total
    assert not DocumentChunk.objects.filter(knowledge_base=kb).exists()


def test_retry_resets_to_pending_before_running(client_rw, kb_factory):
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    task = CleanupTask.objects.create(knowledge_base=kb, status="failed", processed=3, total=9,
                                      error_message="boom")
    response = client_rw.post(f"/cleanup_tasks/{task.id}/retry")  # 回调未提交，任务尚未执行
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "pending"
    assert body["progress"] == {"processed": 0, "total": None, "percentage": None}
    assert body["error_message"] is None


def test_a_running_cleanup_has_one_executor_and_a_finished_one_is_not_run_again(kb_factory):
    """作业租约在别的 worker 手里（活着）：重投递的这一份直接退出；做完的作业再投递也什么都不做。"""
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    add_documents(kb, documents=1, chunks_per_document=2)
    task, job = _submitted(kb)
    Job.objects.filter(pk=job.pk).update(status="running", lease_owner="another-worker",
                                         lease_expires_at=timezone.now() + timedelta(minutes=1))
    run_cleanup(str(job.id))
    task.refresh_from_db()
    assert task.status == "pending" and DocumentChunk.objects.filter(knowledge_base=kb).count() == 2

    Job.objects.filter(pk=job.pk).update(status="queued", lease_owner="", lease_expires_at=None)
    run_cleanup(str(job.id))
    task.refresh_from_db()
    assert task.status == "completed" and Job.objects.get(pk=job.pk).status == "completed"
    finished_at = task.finished_at
    run_cleanup(str(job.id))
    task.refresh_from_db()
    assert task.finished_at == finished_at
