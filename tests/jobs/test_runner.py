"""作业执行器本身（jobs.runner）：登记与沿用、做完再做一次、退避重试与最终失败、取消、未归类的异常、
租约续期与被收回。用一个测试专用的作业种类，不经过摄取与清理的业务代码。"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, transaction
from django.utils import timezone
from django_q.models import Schedule

from jobs import runner
from jobs.models import Job
from jobs.runner import Failure, JobCancelled, JobFailed, JobKind, JobRun, run_job, submit

pytestmark = pytest.mark.django_db


@dataclass
class Probe:
    """测试种类的行为与记录：每次尝试调用 ``behaviour(run)``，失败的记录写进 ``failures``。"""

    behaviour: Callable[[JobRun], None] = lambda run: None
    runs: int = 0
    failures: list[tuple[str, int | None]] = field(default_factory=list)
    put_back: int = 0


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[Probe]:
    state = Probe()

    def execute(run: JobRun) -> None:
        state.runs += 1
        state.behaviour(run)

    def record_failure(job: Job, failure: Failure, retry_in: int | None) -> None:
        state.failures.append((failure.message + runner.attempt_words(job, failure, retry_in), retry_in))

    def put_back(job: Job) -> None:
        state.put_back += 1

    kind = JobKind(name="probe", func="tests.jobs.test_runner.task", execute=execute, record_failure=record_failure,
                   put_back=put_back, max_retries=lambda: 1, retry_base_seconds=lambda: 10)
    monkeypatch.setitem(runner._KINDS, "probe", kind)
    # 交给队列的消息只记下，不执行（测试自己调用 run_job）
    monkeypatch.setattr("django_q.tasks.async_task", lambda *args, **kwargs: None)
    yield state


def _job(**fields: Any) -> Job:
    with transaction.atomic():
        return submit("probe", uuid.uuid4(), queue="ragservice-fast", **fields)


def test_an_open_job_is_reused_and_a_finished_one_is_not(probe: Probe) -> None:
    job = _job()
    assert submit("probe", job.target_id, queue="ragservice-fast").pk == job.pk  # 排队中：沿用
    run_job(str(job.id))
    job.refresh_from_db()
    assert (job.status, job.attempt, job.lease_owner, probe.runs) == ("completed", 1, "", 1)
    assert job.started_at is not None and job.finished_at is not None and job.heartbeat_at is not None
    run_job(str(job.id))  # 重投递：已结束的作业不再执行
    assert probe.runs == 1
    again = submit("probe", job.target_id, queue="ragservice-fast")
    assert again.pk != job.pk and again.status == "queued"  # 结束之后再登记是新的一轮


def test_a_submit_while_running_runs_the_job_once_more(probe: Probe) -> None:
    """运行中又有人登记（条目在处理期间又被写入）：这次做完回到队列，尝试次数从头算，再做一次才结束。"""
    job = _job()

    def resubmitted(run: JobRun) -> None:
        if probe.runs == 1:
            assert submit("probe", job.target_id, queue="ragservice-fast").pk == job.pk

    probe.behaviour = resubmitted
    run_job(str(job.id))
    job.refresh_from_db()
    assert (job.status, job.rerun, job.attempt, probe.put_back) == ("queued", False, 0, 1)
    run_job(str(job.id))
    job.refresh_from_db()
    assert (job.status, job.attempt, probe.runs) == ("completed", 1, 2)


def test_transient_failures_back_off_then_fail_with_the_attempts_named(probe: Probe) -> None:
    def flaky(run: JobRun) -> None:
        raise JobFailed("the model is busy", transient=True)

    probe.behaviour = flaky
    job = _job()
    before = timezone.now()
    run_job(str(job.id))
    job.refresh_from_db()
    assert (job.status, job.attempt, job.error) == ("queued", 1, "the model is busy")
    assert timedelta(seconds=9) < job.run_after - before < timedelta(seconds=12)
    schedule = Schedule.objects.get(name__startswith=f"job:{job.id}:1:")
    assert schedule.next_run == job.run_after and schedule.cluster == "ragservice-fast"
    assert probe.failures == [("the model is busy (attempt 1; retrying in 10 s)", 10)]

    run_job(str(job.id))  # 重试时间没到（重复投递）：不执行
    assert probe.runs == 1
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    run_job(str(job.id))
    job.refresh_from_db()
    assert (job.status, job.attempt) == ("failed", 2) and job.finished_at is not None
    assert probe.failures[-1] == ("the model is busy (gave up after 2 attempts)", None)


@pytest.mark.parametrize(("error", "status", "message"), [
    (OperationalError("server closed the connection unexpectedly"), "queued", "The database connection was lost"),
    (ValueError("bad row"), "failed", "Unexpected error (ValueError): bad row"),
])
def test_unclassified_errors(probe: Probe, error: Exception, status: str, message: str) -> None:
    """处理者没有归类的异常：数据库断开按暂时性重试（原文不进说明：里面有主机与 socket 路径），其余立即失败。"""
    def broken(run: JobRun) -> None:
        raise error

    probe.behaviour = broken
    job = _job()
    run_job(str(job.id))
    job.refresh_from_db()
    assert job.status == status and job.error == message
    assert probe.failures[0][0].startswith(message)


def test_a_gone_target_cancels_the_job(probe: Probe) -> None:
    def gone(run: JobRun) -> None:
        raise JobCancelled()

    probe.behaviour = gone
    job = _job()
    run_job(str(job.id))
    job.refresh_from_db()
    assert (job.status, job.lease_owner, probe.failures) == ("cancelled", "", [])


def test_latest_jobs_picks_each_targets_newest_job(probe: Probe) -> None:
    first = _job()
    run_job(str(first.id))
    second = _job()
    Job.objects.filter(pk=second.pk).update(target_id=first.target_id, created_at=timezone.now() + timedelta(1))
    other = _job()
    latest = runner.latest_jobs([first.target_id, other.target_id, uuid.uuid4()])
    assert {target: job.pk for target, job in latest.items()} == {first.target_id: second.pk,
                                                                  other.target_id: other.pk}


@pytest.mark.django_db(transaction=True)
def test_the_lease_is_renewed_with_heartbeats_and_a_takeover_stops_the_attempt(probe: Probe, settings: Any) -> None:
    """真实的续期线程（不在测试事务里）：租约每 1/4 租期续一次、顺带写心跳；回收器收回租约（令牌换人）后，
    处理者在下一个检查点停手，执行器不改写接手者的行。"""
    settings.TASK_LEASE_SECONDS = 2
    seen: dict[str, Any] = {}

    def long_work(run: JobRun) -> None:
        first = Job.objects.get(pk=run.job.pk)
        time.sleep(1.2)
        renewed = Job.objects.get(pk=run.job.pk)
        seen["renewed"] = renewed.lease_expires_at > first.lease_expires_at
        seen["heartbeat"] = renewed.heartbeat_at > first.heartbeat_at
        Job.objects.filter(pk=run.job.pk).update(lease_owner="reclaimed")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            run.checkpoint()  # 续期线程发现租约已失后，这里抛 LeaseLost
            time.sleep(0.05)
        seen["kept_going"] = True

    probe.behaviour = long_work
    job = _job()
    try:
        run_job(str(job.id))
        job.refresh_from_db()
        assert seen == {"renewed": True, "heartbeat": True}
        assert (job.status, job.lease_owner) == ("running", "reclaimed")  # 归接手者，执行器什么都没写
    finally:
        Job.objects.filter(pk=job.pk).delete()
