"""后台作业的执行器：登记（submit）、交给队列、租约与心跳、退避重试、worker 死亡判定与回收、优雅停止后放回。

以前这些分散在各处：文档行上的租约、advisory lock 做的并发名额（``sleep(0.5)`` 轮询）、每种任务各写一份的一次性
重试调度、只认文档与清理任务的回收器。现在每件工作是一行 :class:`jobs.models.Job`，这里是唯一读写它的代码；
各应用只登记一个 :class:`JobKind`：怎么做（``execute``）、失败怎么告诉用户（``record_failure``）、重试几次。

一次尝试的生命周期：

1. ``submit`` 在调用方的事务里建一行 queued 作业（对象已有未结束的作业就沿用它；运行中的标记 ``rerun``），
   提交后交给作业记下的队列；
2. worker 调用 ``run_job``：条件 UPDATE 把 queued 改成 running、写下租约令牌（有并发上限的种类在同一事务里
   数一遍活着的租约），令牌不对、还没到重试时间、名额已满都不开始；
3. 执行期间后台线程每 1/4 租期续租（顺带写心跳）；处理者在检查点（``JobRun.checkpoint``）发现租约已失就停手，
   发现 worker 要停（``infra.workers.stop_requested``）就放下；提交结果前 ``JobRun.hold`` 锁住作业行核对令牌；
4. 结局只有几种，每种都是一次带令牌条件的写：完成（有 ``rerun`` 则回到队列再做一次）、暂时性失败按
   base·2^(n-1) 退避后重试、永久失败或重试用尽、worker 停止时原样放回（不算尝试，也不算 worker 死亡）；
5. 回收器（``reap``，每分钟）：租约过期未续的 running 作业是 worker 真的死了（优雅停止的 worker 交还了租约），
   记一次死亡，放回它自己的队列；死过 ``MAX_WORKER_DEATHS`` 次或尝试用尽就失败。交给队列后久久没人开始的
   queued 作业再交一次（消息丢了：worker 取走后、开始前被杀，Redis 的 BLPOP 取走即删）。

租约写在行里而不用 advisory lock：数据库重启会释放 advisory lock，租约却留在行里，仍活着的 worker 照样持有它。
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.conf import settings
from django.db import DatabaseError, connection, models, transaction
from django.db.models import ExpressionWrapper, F, Q
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from infra import metrics
from infra.context import current_request_id
from infra.errors import is_database_unavailable
from infra.retry import backoff_seconds, database_ready
from infra.workers import stop_requested
from jobs.models import OPEN, Job

logger = structlog.get_logger(__name__)

# 弄死 worker 几次就判定工作本身有害（文件让解析器吃光内存）：第一次可能是巧合（别的任务占满内存、机器掉电），
# 第二次不再给机会。停止服务不在此列：优雅停止的 worker 交还了租约
MAX_WORKER_DEATHS = 2
# 并发名额已满时，多久后再来（不计入尝试次数）
SLOT_RETRY_SECONDS = 10
# 重试时间的容差：调度器与 worker 在不同机器上时钟略有出入，早到一两秒的投递照样执行
DUE_TOLERANCE = timedelta(seconds=2)


class WorkerStopping(Exception):
    """worker 收到了停止信号（服务停止、重启）：在检查点放下这次尝试。不算失败，也不算 worker 死亡。"""


class LeaseLost(Exception):
    """租约已被回收器收回（租约过期时本 worker 联系不上数据库）：别人在接手，放弃本次结果，什么都不写。"""


class JobCancelled(Exception):
    """工作的对象已经不在了（文档或知识库被删除）：作业结束为 cancelled，不算失败。"""


@dataclass(frozen=True)
class Failure:
    """一次失败：``deaths`` 非零表示执行它的 worker 死了（回收器的判定），否则是处理者报告的错误。"""

    message: str
    transient: bool
    deaths: int = 0


class JobFailed(Exception):
    """处理者报告的失败；``transient`` 的按退避自动重试，其余立即失败。message 写给维护者看。"""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.failure = Failure(message=message, transient=transient)


def _nothing(job: Job) -> None:
    return None


def _no_timeout() -> int | None:
    return None


def _no_limit(job: Job) -> int | None:
    return None


@dataclass(frozen=True)
class JobKind:
    """一种作业的处理者（各应用在导入时 ``register``）。

    - ``func``：django-q2 里的任务函数名（``module.function(job_id, request_id=...)``，它调用 ``run_job``）；
      队列共享（``infra.broker``）与 django-q2 的任务记录都按它区分种类；
    - ``execute``：做一次尝试；正常返回即完成，失败抛 ``JobFailed``，对象不在了抛 ``JobCancelled``；
    - ``record_failure(job, failure, retry_in)``：把失败写到对象上给用户看（``retry_in`` 为 None 表示不再重试）；
    - ``put_back(job)``：作业回到队列（worker 停止或死亡、等重试、做完再做一次）时，清掉对象上“正在做”的痕迹；
    - ``concurrency(job)``：同一种类、同一队列里同时运行的上限（None 不限）。
    """

    name: str
    func: str
    execute: Callable[[JobRun], None]
    record_failure: Callable[[Job, Failure, int | None], None]
    max_retries: Callable[[], int]
    retry_base_seconds: Callable[[], int]
    put_back: Callable[[Job], None] = _nothing
    timeout: Callable[[], int | None] = _no_timeout
    concurrency: Callable[[Job], int | None] = _no_limit


_KINDS: dict[str, JobKind] = {}


def register(kind: JobKind) -> None:
    _KINDS[kind.name] = kind


def attempt_words(job: Job, failure: Failure, retry_in: int | None) -> str:
    """失败说明的尾巴：“第几次、多久后重试”或“试了几次放弃了”；永久失败不加。"""
    if retry_in is not None:
        return f" (attempt {job.attempt}; retrying in {retry_in} s)"
    if failure.transient:
        return f" (gave up after {job.attempt} attempts)"
    return ""


# ---------------------------------------------------------------- 登记与交给队列


def submit(kind: str, target_id: Any, *, queue: str, knowledge_base_id: Any = None, push: bool = True) -> Job:
    """为 ``target_id`` 登记一件工作，返回它的作业。须在调用方的事务里、锁住对象行之后调用。

    对象已有未结束的作业就沿用它：排队中的本来就会读到最新的内容；运行中的标记 ``rerun``，做完这次再做一次
    （它可能已经读过旧内容）。否则新建一行 queued 作业，事务提交后交给 ``queue``（``push=False`` 时由调用方
    自己在本进程里 ``run_job``，如 ``manage.py reindex``）。
    """
    current = Job.objects.select_for_update().filter(target_id=target_id, status__in=OPEN).first()
    if current is not None:
        if current.status == Job.Status.RUNNING and not current.rerun:
            Job.objects.filter(pk=current.pk).update(rerun=True, updated_at=Now())
        return current
    job = Job.objects.create(kind=kind, target_id=target_id, queue=queue, knowledge_base_id=knowledge_base_id,
                             request_id=current_request_id() or "", pushed_at=timezone.now())
    if push:
        _push(job)
    return job


def _push(job: Job, *, at: datetime | None = None) -> None:
    """把作业交给它的队列。``at`` 给定时是到点才交（一次性 Schedule，与调用方的事务一起提交）；否则在调用方的
    事务提交之后交：消息不能先于作业行可见（Redis 不在事务里，worker 可能读不到还没提交的行）。"""
    # django_q 的模型与 tasks 模块只能在应用注册表就绪之后导入，而本模块更早就会被导入：在调用时导入
    from django_q.models import Schedule
    from django_q.tasks import async_task

    kind = _KINDS[job.kind]
    timeout = kind.timeout()
    if at is None:
        options = {"timeout": timeout} if timeout is not None else {}
        transaction.on_commit(lambda: async_task(kind.func, str(job.id), request_id=job.request_id or None,
                                                 cluster=job.queue, **options))
        return
    kwargs: dict[str, Any] = {"request_id": job.request_id or None}
    if timeout is not None:
        # django-q2 的约定：调度器入队时从 kwargs 取出 q_options，作为这次执行的选项，不会传给任务函数
        kwargs["q_options"] = {"timeout": timeout}
    Schedule.objects.create(
        name=f"job:{job.id}:{job.attempt}:{at.timestamp():.0f}", func=kind.func, args=repr((str(job.id),)),
        kwargs=repr(kwargs), schedule_type=Schedule.ONCE, repeats=-1, next_run=at, cluster=job.queue)


# ---------------------------------------------------------------- 租约


def _expiry(ttl: int) -> Any:
    # 用数据库时钟：多台机器上的 worker 与回收器比较的是同一个“现在”
    return ExpressionWrapper(Now() + timedelta(seconds=ttl), output_field=models.DateTimeField())


@dataclass
class Lease:
    """作业行上的租约：令牌写在行里，后台线程续期（顺带写心跳）。``lost`` 置位表示已被回收器收回。"""

    job_id: Any
    token: str
    ttl: int
    lost: threading.Event = field(default_factory=threading.Event)

    def rows(self) -> models.QuerySet[Job]:
        """仍由本租约持有的那一行（空查询集即租约已失）。"""
        return Job.objects.filter(pk=self.job_id, lease_owner=self.token)

    def renew(self) -> bool:
        renewed = self.rows().update(lease_expires_at=_expiry(self.ttl), heartbeat_at=Now())
        if not renewed:
            self.lost.set()
        return bool(renewed)


def _keep_renewed(lease: Lease, stop: threading.Event) -> None:
    """续期线程：每 1/4 租期续一次；数据库暂时连不上就换新连接继续试，租约被收回则退出。"""
    try:
        while not stop.wait(lease.ttl / 4):
            try:
                if not lease.renew():
                    logger.warning("job_lease_lost", job_id=str(lease.job_id))
                    return
            except DatabaseError:
                logger.warning("job_lease_renew_failed", job_id=str(lease.job_id), exc_info=True)
                connection.close()
    finally:
        # 线程自己的连接：不关就一直占着数据库的一个会话
        connection.close()


@contextmanager
def _renewed(lease: Lease) -> Iterator[None]:
    """执行期间在后台续租。在调用方的事务里同步执行时（测试、调试）不开线程：续期线程用自己的连接，看不到
    调用方尚未提交的作业行；同步执行时也不存在会来接手的其他 worker。"""
    stop = threading.Event()
    keeper = threading.Thread(target=_keep_renewed, args=(lease, stop), daemon=True, name=f"lease-{lease.job_id}")
    if not connection.in_atomic_block:
        keeper.start()
    try:
        yield
    finally:
        stop.set()
        if keeper.is_alive():
            keeper.join()


@dataclass
class JobRun:
    """一次尝试交给处理者的上下文。"""

    job: Job
    lease: Lease

    def checkpoint(self) -> None:
        """检查点：租约已失就立即停手（``LeaseLost``），worker 要停就放下这次尝试（``WorkerStopping``）。"""
        if self.lease.lost.is_set():
            raise LeaseLost()
        if stop_requested():
            raise WorkerStopping()

    def hold(self) -> None:
        """提交结果前的最后一道核对，须在处理者写结果的事务里调用：锁住作业行，令牌不是自己的就 ``LeaseLost``。
        回收器收回租约也要锁这一行，于是“核对通过”与“被收回”不会交错：收回之后，活儿干完了也不写。"""
        if not Job.objects.select_for_update().filter(pk=self.job.pk, lease_owner=self.lease.token).exists():
            raise LeaseLost()


# ---------------------------------------------------------------- 执行一次尝试


def run_job(job_id: str) -> None:
    """django-q2 的任务函数调用这里：执行（或跳过）一次作业尝试。重复投递、过期的消息、已结束的作业、
    别人在做的作业都会被安全地忽略；worker 在停止时，这次尝试在检查点停下，交还租约后原样放回队列。"""
    database_ready()
    job = Job.objects.filter(pk=job_id).first()
    if job is None or job.status != Job.Status.QUEUED:
        logger.info("job_skipped", job_id=job_id, status=getattr(job, "status", None))
        return
    kind = _KINDS[job.kind]
    with structlog.contextvars.bound_contextvars(job_id=str(job.id), job_kind=job.kind, target_id=str(job.target_id)):
        if stop_requested():
            # 停止途中才交到手上的：不开始，原样放回自己的队列
            _push(job)
            logger.info("job_requeued_worker_stopping", queue=job.queue)
            return
        lease = Lease(job_id=job.pk, token=uuid.uuid4().hex, ttl=settings.TASK_LEASE_SECONDS)
        claimed = _claim(job, kind, lease)
        if claimed is not None:
            _attempt(claimed, kind, lease)


def _claim(job: Job, kind: JobKind, lease: Lease) -> Job | None:
    """queued → running 并写下租约；还没到重试时间、名额已满（稍后再来，不算尝试）、别人先取走了都返回 None。"""
    due = timezone.now() + DUE_TOLERANCE
    if job.run_after is not None and job.run_after > due:
        logger.info("job_skipped_not_due", run_after=job.run_after.isoformat())
        return None
    limit = kind.concurrency(job)
    with transaction.atomic():
        if limit is not None:
            # 数名额与占名额在同一把事务锁下：并发的两个 worker 不会都以为还剩一个
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                               [f"jobs:{job.kind}:{job.queue}"])
            running = Job.objects.filter(kind=job.kind, queue=job.queue, status=Job.Status.RUNNING,
                                         lease_expires_at__gt=Now()).count()
            if running >= limit:
                Job.objects.filter(pk=job.pk, status=Job.Status.QUEUED).update(pushed_at=Now())
                _push(job, at=timezone.now() + timedelta(seconds=SLOT_RETRY_SECONDS))
                logger.info("job_deferred_no_slot", retry_in_s=SLOT_RETRY_SECONDS, limit=limit)
                return None
        taken = Job.objects.filter(pk=job.pk, status=Job.Status.QUEUED).filter(
            Q(run_after__isnull=True) | Q(run_after__lte=due)
        ).update(status=Job.Status.RUNNING, lease_owner=lease.token, lease_expires_at=_expiry(lease.ttl),
                 heartbeat_at=Now(), attempt=F("attempt") + 1, run_after=None,
                 started_at=Coalesce("started_at", Now()), updated_at=Now())
    if not taken:
        logger.info("job_skipped_busy")
        return None
    return Job.objects.get(pk=job.pk)


def _attempt(job: Job, kind: JobKind, lease: Lease) -> None:
    run = JobRun(job=job, lease=lease)
    try:
        with _renewed(lease):
            kind.execute(run)
    except WorkerStopping:
        _put_back(run, kind)
        logger.info("job_requeued_worker_stopping", queue=job.queue, attempt=job.attempt)
        return
    except LeaseLost:
        # 作业行归接手的执行者管，这里什么都不写
        logger.warning("job_abandoned_lease_lost")
        return
    except JobCancelled:
        _close(run, Job.Status.CANCELLED)
        logger.info("job_cancelled_target_gone")
        return
    except JobFailed as exc:
        _fail_or_retry(run, kind, exc.failure)
        return
    except Exception as exc:
        _fail_or_retry(run, kind, _classify(exc))
        return
    _complete(run, kind)


def _classify(exc: BaseException) -> Failure:
    """处理者没有归类的异常：数据库断开是暂时的，其余按永久失败（原文见日志）。"""
    if is_database_unavailable(exc):
        # 驱动报错原文里有主机与 socket 路径，不进给用户看的说明
        logger.warning("job_database_error", exc_info=exc)
        return Failure("The database connection was lost", transient=True)
    logger.error("job_unexpected_error", exc_info=exc)
    return Failure(f"Unexpected error ({type(exc).__name__}): {exc}", transient=False)


def _released(**fields: Any) -> dict[str, Any]:
    return {"lease_owner": "", "lease_expires_at": None, "updated_at": timezone.now(), **fields}


def _put_back(run: JobRun, kind: JobKind) -> None:
    """worker 在停止：交还租约，作业原样（同一个尝试号）回到自己的队列，服务再起来时接着做。"""
    kind.put_back(run.job)
    if run.lease.rows().update(**_released(status=Job.Status.QUEUED, attempt=F("attempt") - 1,
                                           pushed_at=timezone.now())):
        # 交还之后才交给队列：别的 worker 先拿到这条消息时不会因为租约还在而跳过它（跳过就丢了）。
        # 交还与入队之间 worker 被 SIGKILL 的话，回收器的“交给队列后久久没人开始”会再交一次
        _push(run.job)


def _close(run: JobRun, status: str) -> None:
    run.lease.rows().update(**_released(status=status, finished_at=timezone.now()))


def _complete(run: JobRun, kind: JobKind) -> None:
    """完成；运行期间有人要求再做一次（``rerun``）就回到队列，尝试次数从头算。"""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=run.job.pk, lease_owner=run.lease.token).first()
        if job is None:
            logger.warning("job_completion_not_recorded_lease_lost")
            return
        if job.rerun:
            Job.objects.filter(pk=job.pk).update(**_released(status=Job.Status.QUEUED, rerun=False, attempt=0,
                                                              error="", pushed_at=timezone.now()))
            kind.put_back(job)
            _push(job)
            logger.info("job_rerun_requested")
            return
        Job.objects.filter(pk=job.pk).update(**_released(status=Job.Status.COMPLETED, error="",
                                                          finished_at=timezone.now()))


def _fail_or_retry(run: JobRun, kind: JobKind, failure: Failure) -> None:
    # 失败多半发生在数据库断开之后：手里的连接已经死了，先换一条能用的再记录
    database_ready()
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=run.job.pk, lease_owner=run.lease.token).first()
        if job is None:
            logger.info("job_failure_not_recorded_lease_lost", error=failure.message)
            return
        job.error = failure.message[:4000]
        job.lease_owner, job.lease_expires_at = "", None
        if failure.transient and job.attempt <= kind.max_retries():
            delay = backoff_seconds(kind.retry_base_seconds(), job.attempt)
            job.status = Job.Status.QUEUED
            job.run_after = job.pushed_at = timezone.now() + timedelta(seconds=delay)
            job.save()
            kind.record_failure(job, failure, delay)
            kind.put_back(job)
            _push(job, at=job.run_after)
            metrics.JOB_RETRIES.labels(kind=job.kind).inc()
            logger.warning("job_retry_scheduled", error=failure.message, delay_s=delay, attempt=job.attempt)
            return
        job.status = Job.Status.FAILED
        job.finished_at = timezone.now()
        job.save()
        kind.record_failure(job, failure, None)
    logger.error("job_failed", error=failure.message, attempts=job.attempt)


# ---------------------------------------------------------------- 回收


def reap(*, stale_after: timedelta) -> list[str]:
    """每分钟由回收任务调用，返回处理过的作业 id。

    - running 且租约过期未续：执行者真的死了。收回租约、记一次死亡（与仍活着的执行者续期互斥：续上了就不收回），
      回到它自己的队列；死过 ``MAX_WORKER_DEATHS`` 次或尝试用尽就失败；
    - queued、没在等重试、交给队列已超过 ``stale_after`` 还没人开始：再交一次。重复无害，先到的那份做，
      后到的看到作业已不是 queued 就跳过。
    """
    handled = [str(job_id) for job_id in _reclaim_dead()]
    cutoff = timezone.now() - stale_after
    waiting = Job.objects.filter(status=Job.Status.QUEUED).filter(
        Q(pushed_at__isnull=True) | Q(pushed_at__lt=cutoff)).filter(Q(run_after__isnull=True) | Q(run_after__lt=cutoff))
    for job in waiting:
        # 先刷新 pushed_at（带原值条件）：队列积压时不至于每分钟重复交，两个回收器也不会各交一次
        if not Job.objects.filter(pk=job.pk, status=Job.Status.QUEUED, pushed_at=job.pushed_at).update(
                pushed_at=timezone.now()):
            continue
        _push(job)
        metrics.STALE_TASKS_REQUEUED.labels(kind=job.kind).inc()
        logger.warning("job_requeued_waiting", job_id=str(job.id), job_kind=job.kind, queue=job.queue)
        handled.append(str(job.id))
    return handled


def _reclaim_dead() -> Iterable[Any]:
    for job_id in Job.objects.filter(status=Job.Status.RUNNING, lease_expires_at__lt=Now()).values_list(
            "pk", flat=True):
        with transaction.atomic():
            job = Job.objects.select_for_update(skip_locked=True).filter(
                pk=job_id, status=Job.Status.RUNNING, lease_expires_at__lt=Now()).first()
            if job is None:
                continue
            kind = _KINDS[job.kind]
            job.worker_deaths += 1
            job.lease_owner, job.lease_expires_at = "", None
            metrics.STALE_TASKS_REQUEUED.labels(kind=job.kind).inc()
            if job.worker_deaths >= MAX_WORKER_DEATHS or job.attempt > kind.max_retries():
                failure = Failure("The worker stopped unexpectedly", transient=False, deaths=job.worker_deaths)
                job.status, job.error, job.finished_at = Job.Status.FAILED, failure.message, timezone.now()
                job.save()
                kind.record_failure(job, failure, None)
                logger.error("job_failed_worker_died", job_id=str(job.id), job_kind=job.kind,
                             worker_deaths=job.worker_deaths)
            else:
                job.status, job.pushed_at = Job.Status.QUEUED, timezone.now()
                job.save()
                kind.put_back(job)
                _push(job)
                logger.warning("job_requeued_worker_died", job_id=str(job.id), job_kind=job.kind, queue=job.queue,
                               worker_deaths=job.worker_deaths)
        yield job_id


# ---------------------------------------------------------------- 查询


def latest_jobs(target_ids: Iterable[Any]) -> dict[Any, Job]:
    """每个对象最近的一个作业（API 与管理后台显示尝试次数、下次重试时间用）；一条查询。"""
    ids = list(target_ids)
    if not ids:
        return {}
    rows = Job.objects.filter(target_id__in=ids).order_by("target_id", "-created_at").distinct("target_id")
    return {job.target_id: job for job in rows}
