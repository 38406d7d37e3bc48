"""django-q2 的代理（``Q_CLUSTER["broker_class"]``）：集群只在有 worker 空着时取任务，空闲的主队列 worker 也做
快队列里的小文件。见 docs/INVARIANTS.md 的 ``IDLE-WORKER-TAKES-WORK``。

两个队列（``ragservice/settings.py`` 的 ``Q_CLUSTER``）：主队列跑大文件摄取；快队列（``settings.FAST_QUEUE``）跑
小文件、知识条目与维护任务（清理、回收、索引同步）。django-q2 的一个集群只读自己的队列，于是 15 个小文件由快队列
的 1 个 worker 一个接一个地做，主队列的 worker 在旁边空着。这里的规则：

- **有空才取**：pusher 每次取任务前看忙闲表（``infra.workers.WorkerBoard``），本集群有 worker 空着、且上一个交出
  的任务已被取走，才去队列里取。任务不会被预取进忙着的集群里干等（django-q2 默认会预取 ``workers²`` 个）；
- **先自己的，再帮快队列**：主队列的集群在自己的队列空了时，取快队列里最早的、可以分担的任务
  （``settings.QUEUE_SHARED_TASKS``，即摄取；清理、索引同步一跑可能几小时，留给快队列自己的 worker，免得占住主队列的
  worker）。``RAG_QUEUE_MAIN_TAKES_FAST=false`` 关掉这一条；
- **快队列从不取主队列的任务**：小文件与维护任务不会排在一个长文档后面。

任务被别的集群取走后，记录与确认照旧（ORM 代理按行 id 确认；django-q2 的 Task 行记下实际执行的集群名）。
没有忙闲表的进程（不是经本项目的 qcluster 启动的集群）退回 django-q2 原来的行为：不等空闲、不分担。

Redis（``RAG_REDIS_URL``）同样的规则：自己的队列用 ``LPOP``，空了再看快队列的队首——是可以分担的任务就在
``WATCH``/``MULTI`` 事务里取走它（队首被别人先取走则放弃这一次），不是就不动它；两者都空时睡 ``poll`` 秒再看。
django-q2 自带的 Redis 代理用 1 秒的 ``BLPOP`` 等自己的队列；这里在有空闲 worker 时改为轮询（默认每 0.5 秒两三条
命令），换来能同时看两个队列、且只取可以分担的任务。Redis 的 ``BLPOP`` 取走即删，本来就没有重投递，这一点不变。
"""

from __future__ import annotations

from time import monotonic, sleep
from typing import Any

import structlog
from django.conf import settings
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.brokers.redis_broker import Redis
from django_q.conf import Conf
from django_q.signing import SignedPackage
from redis.exceptions import WatchError

from infra.workers import board

logger = structlog.get_logger(__name__)

# 主队列在快队列里最多看多少个最早的任务，找一个可以分担的
SHARE_SCAN = 20


def _shareable(payload: Any) -> bool:
    """这条消息的任务函数在 ``settings.QUEUE_SHARED_TASKS`` 里。解不开的消息不碰（留给它自己的集群去报错）。"""
    try:
        task = SignedPackage.loads(payload)
    except Exception:  # 签名不符、反序列化失败：都按“不能分担”处理
        return False
    return isinstance(task, dict) and task.get("func") in settings.QUEUE_SHARED_TASKS


def _shares(list_key: str, fast_key: str) -> bool:
    return bool(settings.QUEUE_MAIN_TAKES_FAST) and list_key != fast_key


class SharingORM(ORM):
    """数据库队列（默认）：有空才取；主队列空了取快队列里最早的可分担任务。"""

    def dequeue(self) -> list[tuple[int, str]] | None:
        table = board()
        if table is not None and not table.wait_for_free_worker(Conf.POLL):
            return None
        tasks = self._claim(self.list_key, shared_only=False)
        if not tasks and table is not None and _shares(self.list_key, settings.FAST_QUEUE):
            # 只有知道本集群确有 worker 空着时才分担：取到的任务马上有人做，不会排在长文档后面
            tasks = self._claim(settings.FAST_QUEUE, shared_only=True)
            if tasks:
                logger.info("queue_task_shared", from_queue=settings.FAST_QUEUE, to_queue=self.list_key)
        if tasks:
            if table is not None:
                table.handed.value = monotonic()
            return tasks
        sleep(Conf.POLL)
        return None

    def _claim(self, key: str, *, shared_only: bool) -> list[tuple[int, str]]:
        """按入队先后取 ``key`` 队列里到期的任务（条件 UPDATE 锁定，别的集群先锁了就跳过）。"""
        candidates = (self.get_connection().filter(key=key, lock__lt=timezone.now())
                      .order_by("id")[: SHARE_SCAN if shared_only else Conf.BULK])
        claimed: list[tuple[int, str]] = []
        for task in candidates:
            if shared_only and not _shareable(task.payload):
                continue
            if self.get_connection().filter(id=task.id, lock=task.lock).update(lock=self.timeout(task)):
                claimed.append((task.pk, task.payload))
                if shared_only or len(claimed) >= Conf.BULK:
                    break
        return claimed


class SharingRedis(Redis):
    """Redis 队列：同样的规则（见模块说明）。"""

    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key)
        # 与 django-q2 的 Redis 代理同样的键名：django_q:<集群名>:q
        self.fast_key = f"django_q:{settings.FAST_QUEUE}:q"

    def dequeue(self) -> list[tuple[None, bytes]] | None:
        table = board()
        if table is None:
            return super().dequeue()  # type: ignore[no-any-return]
        if not table.wait_for_free_worker(Conf.POLL):
            return None
        if not _shares(self.list_key, self.fast_key):
            popped = self.connection.blpop(self.list_key, 1)
            task = popped[1] if popped else None
        else:
            task = self.connection.lpop(self.list_key) or self._take_shared()
            if task is None:
                sleep(Conf.POLL)
        if task is None:
            return None
        table.handed.value = monotonic()
        return [(None, task)]

    def _take_shared(self) -> bytes | None:
        """快队列的队首是可以分担的任务就取走它；队首在检查与取走之间变了（别人先取）就放弃这一次。"""
        with self.connection.pipeline() as pipe:
            try:
                pipe.watch(self.fast_key)
                head = pipe.lindex(self.fast_key, 0)
                if head is None or not _shareable(head):
                    return None
                pipe.multi()
                pipe.lpop(self.fast_key)
                task = pipe.execute()[0]
            except WatchError:
                return None
        if task is not None:
            logger.info("queue_task_shared", from_queue=settings.FAST_QUEUE, to_queue=self.list_key)
        return task  # type: ignore[no-any-return]
