"""维护任务（知识库清理、知识库自己的 HNSW 索引同步）按 RAG_MAINTENANCE_TIMEOUT 计时，重复投递无害。

1M 分块的库清理约一小时、建图 40 分钟以上，都比 RAG_TASK_TIMEOUT 长（bench/README.md）。这里核对：
入队、自动重试、回收器重新入队、定时调度四条路都带上维护任务的 timeout；ORM 代理在 retry 之后再投递的那一份
拿不到按知识库的 advisory lock，不碰另一个会话正在建的索引、不与正在进行的清理并发。锁从另一条数据库连接持有，
与另一个 worker 进程持锁是同一回事。
"""

from __future__ import annotations

import ast
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.core.management.sql import emit_post_migrate_signal
from django.db import connection, connections
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.models import Schedule
from django_q.scheduler import scheduler
from django_q.signals import pre_enqueue

from infra.principal import SYSTEM_PRINCIPAL
from jobs.models import Job
from jobs.runner import reap
from knowledge.models import CleanupTask, KnowledgeBase
from knowledge.services import cleanup_submit, knowledge_base_delete
from ops import cleanup
from ops.tasks import MAINTENANCE_SCHEDULES, run_cleanup
from search import ann
from tests.factories import add_documents

MAINTENANCE_TIMEOUT = 4321


@pytest.fixture
def enqueued(settings: Any) -> Iterator[list[dict[str, Any]]]:
    """截下每个入队的 django-q2 任务包（测试里任务随后同步执行）。"""
    settings.MAINTENANCE_TIMEOUT = MAINTENANCE_TIMEOUT
    packages: list[dict[str, Any]] = []

    def record(sender: str, task: dict[str, Any], **_: Any) -> None:
        packages.append(dict(task))

    pre_enqueue.connect(record, dispatch_uid="test.maintenance.enqueued")
    yield packages
    pre_enqueue.disconnect(dispatch_uid="test.maintenance.enqueued")


@contextmanager
def held_elsewhere(key: str) -> Iterator[None]:
    """在另一条数据库连接（相当于另一个 worker）上持有 ``infra.locks`` 的 advisory lock。"""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [key])
        yield
    finally:
        # 显式释放：只关连接时服务器端异步释放会话锁，紧接着的操作可能仍看到锁被占用
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [key])
        other.close()


@pytest.mark.django_db
def test_cleanup_is_enqueued_retried_and_requeued_with_the_maintenance_timeout(
        kb_factory: Callable[..., KnowledgeBase], run_on_commit: Callable[..., Any], enqueued: list[dict[str, Any]],
        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    kb = kb_factory()
    add_documents(kb, documents=1, chunks_per_document=2)
    task = run_on_commit(knowledge_base_delete, principal=SYSTEM_PRINCIPAL, kb_id=kb.id)
    [package] = [p for p in enqueued if p["func"] == cleanup.CLEANUP_TASK_FUNC]
    assert (package["timeout"], package["cluster"]) == (MAINTENANCE_TIMEOUT, settings.FAST_QUEUE)
    task.refresh_from_db()
    assert task.status == CleanupTask.Status.COMPLETED

    # 自动重试的一次性调度：timeout 在 kwargs 的 q_options 里，调度器入队时取出
    def broken(kb_id: uuid.UUID, batch_size: int) -> int:
        raise RuntimeError("database is read-only")

    monkeypatch.setattr(cleanup, "delete_batch", broken)
    failing = CleanupTask.objects.create(knowledge_base=kb_factory(status=KnowledgeBase.Status.DELETED))
    job = cleanup_submit(failing)
    run_cleanup(str(job.id))
    schedule = Schedule.objects.get(name__startswith=f"job:{job.id}:1:")
    assert ast.literal_eval(schedule.kwargs)["q_options"] == {"timeout": MAINTENANCE_TIMEOUT}
    assert schedule.cluster == settings.FAST_QUEUE

    # 回收器重新交给队列（调度丢了：重试时间早已过去；任务只记下，不执行）
    queued: list[dict[str, Any]] = []
    monkeypatch.setattr("django_q.tasks.async_task", lambda *args, **kwargs: queued.append(kwargs))
    long_ago = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=job.pk).update(run_after=long_ago, pushed_at=long_ago)
    assert run_on_commit(reap, stale_after=timedelta(minutes=5)) == [str(job.id)]
    assert queued[0]["timeout"] == MAINTENANCE_TIMEOUT and queued[0]["cluster"] == settings.FAST_QUEUE


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "func"), sorted(MAINTENANCE_SCHEDULES.items()))
def test_maintenance_schedules_run_with_the_maintenance_timeout(enqueued: list[dict[str, Any]], name: str,
                                                                func: str) -> None:
    """迁移建立的维护调度（索引同步、相关概率模型、全文 L0 收缩）在每次 migrate 后（post_migrate）带上当前的
    RAG_MAINTENANCE_TIMEOUT，调度器按它入队。"""
    emit_post_migrate_signal(0, False, "default")
    schedule = Schedule.objects.get(name=name)
    assert schedule.func == func
    assert ast.literal_eval(schedule.kwargs) == {"q_options": {"timeout": MAINTENANCE_TIMEOUT}}
    Schedule.objects.filter(pk=schedule.pk).update(next_run=timezone.now() - timedelta(seconds=1))
    scheduler(broker=get_broker())
    [package] = [p for p in enqueued if p["func"] == func]
    assert package["timeout"] == MAINTENANCE_TIMEOUT
    assert "q_options" not in package["kwargs"]  # 是 django-q2 的选项，不是传给任务函数的参数


@pytest.mark.django_db
def test_a_long_cleanup_with_a_live_lease_is_not_reaped(kb_factory: Callable[..., KnowledgeBase]) -> None:
    """清理先删倒排的那一段（1M 分块约一小时）不更新任何进度：只要执行者的租约还在续，两小时没动静也不是孤儿。"""
    kb = kb_factory(status=KnowledgeBase.Status.DELETED)
    task = CleanupTask.objects.create(knowledge_base=kb, status=CleanupTask.Status.RUNNING)
    job = cleanup_submit(task)
    two_hours_ago = timezone.now() - timedelta(hours=2)
    Job.objects.filter(pk=job.pk).update(status="running", attempt=1, lease_owner="busy-worker",
                                         lease_expires_at=timezone.now() + timedelta(seconds=30),
                                         pushed_at=two_hours_ago, started_at=two_hours_ago)
    CleanupTask.objects.filter(pk=task.pk).update(updated_at=two_hours_ago)
    assert reap(stale_after=timedelta(minutes=5)) == []
    run_cleanup(str(job.id))  # 重投递的那一份：作业在别人手里，直接退出
    assert CleanupTask.objects.get(pk=task.pk).processed == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_concurrent_index_build_leaves_the_index_being_built_alone(settings: Any) -> None:
    """另一个会话持有建索引的锁时（它在建，或 worker 被硬杀后服务器端那条 CREATE INDEX 还在跑），第二次
    kb_index_build、kb_index_drop 与定时同步都不碰这个知识库的索引。索引的压缩方式与知识库设置不符，
    不持锁时 kb_index_build 会删掉重建——正是对待上次建到一半的无效索引的那条路。"""
    settings.ANN_KB_INDEX_MIN_CHUNKS = 10
    kb = KnowledgeBase.objects.create(name=f"ann-lock-{uuid.uuid4().hex[:6]}", embedding_dimension=384,
                                      vector_compression=KnowledgeBase.VectorCompression.NONE)
    add_documents(kb, documents=2, chunks_per_document=10)
    try:
        assert ann.kb_index_build(kb=kb) is True
        oid = _index_oid(kb.id)
        kb.vector_compression = KnowledgeBase.VectorCompression.HALFVEC
        kb.save(update_fields=["vector_compression"])
        with held_elsewhere(ann.kb_index_lock_key(kb.id)):
            assert ann.kb_index_build(kb=kb) is False
            assert ann.kb_index_drop(kb_id=kb.id) is False
            kb.status = KnowledgeBase.Status.DELETED
            kb.save(update_fields=["status"])
            assert ann.kb_indexes_sync() == {"built": [], "dropped": []}
            assert _index_oid(kb.id) == oid
            assert ann.kb_index_state(kb.id) == ann.KbIndex(ann.kb_index_name(kb.id), "none", True,
                                                            excludes_pending=True)
        # 锁释放后下一轮同步照常删掉已删除知识库的索引
        assert ann.kb_indexes_sync() == {"built": [], "dropped": [str(kb.id)]}
    finally:
        ann.kb_index_drop(kb_id=kb.id)


def _index_oid(kb_id: uuid.UUID) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::regclass::oid", [ann.kb_index_name(kb_id)])
        return int(cursor.fetchone()[0])
