"""代理的取任务规则（infra.broker，见 docs/INVARIANTS.md 的 IDLE-WORKER-TAKES-WORK）：有空才取、先自己的队列、
主队列空闲时取快队列里最早的摄取、快队列从不取主队列的任务。在本进程里直接调用代理，用本进程的 pid 扮演 worker；
真实进程里的调度见 tests/ops/test_graceful_stop.py::test_idle_main_worker_takes_small_uploads_beside_a_long_one。"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from infra import workers
from infra.broker import SharingORM, SharingRedis
from infra.workers import WorkerBoard, on_task_started, on_worker_ready
from tests.ops.test_scale_out import redis_url  # noqa: F401 - 夹具：127.0.0.1 上临时的 redis-server

MAIN, FAST = "ragservice", "ragservice-fast"
INGEST, CLEANUP = "documents.tasks.run_ingestion", "ops.tasks.run_cleanup"


@pytest.fixture
def board(monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerBoard]:
    """本集群的忙闲表；本进程扮演表上唯一的 worker（起初不在表上，即没有空闲 worker）。"""
    table = WorkerBoard(slots=4)
    monkeypatch.setattr(workers, "_board", table)
    monkeypatch.setattr(workers, "_slot", None)
    monkeypatch.setattr(Conf, "POLL", 0.05)
    yield table


def _package(func: str, name: str) -> str:
    return str(SignedPackage.dumps({"id": name, "name": name, "func": func, "args": (name,), "kwargs": {}}))


def _names(tasks: list[tuple[Any, Any]] | None) -> list[str]:
    return [SignedPackage.loads(payload)["name"] for _, payload in tasks or []]


def _orm_queue(key: str, *tasks: tuple[str, str]) -> None:
    for func, name in tasks:
        SharingORM(list_key=key).enqueue(_package(func, name))


def test_a_cluster_takes_work_only_when_a_worker_is_free(db, board: WorkerBoard) -> None:
    _orm_queue(MAIN, (INGEST, "big-1"), (INGEST, "big-2"))
    main = SharingORM(list_key=MAIN)
    started = time.monotonic()
    assert main.dequeue() is None  # 没有空闲 worker：不取，也不锁任何任务
    assert time.monotonic() - started < 1
    assert OrmQ.objects.filter(key=MAIN).count() == main.queue_size() == 2

    on_worker_ready()  # worker 预热完，空闲
    assert _names(main.dequeue()) == ["big-1"]  # 按入队先后
    assert main.dequeue() is None  # 交出的任务还没有 worker 开始执行：不再取
    on_task_started()
    assert main.dequeue() is None  # 唯一的 worker 忙着
    workers.on_task_finished()
    assert _names(main.dequeue()) == ["big-2"]


def test_idle_main_worker_takes_the_oldest_ingestion_of_the_fast_queue(db, board: WorkerBoard) -> None:
    _orm_queue(FAST, (CLEANUP, "cleanup"), (INGEST, "small-1"), (INGEST, "small-2"))
    on_worker_ready()
    main = SharingORM(list_key=MAIN)
    assert _names(main.dequeue()) == ["small-1"]  # 清理可能一跑几小时，留给快队列自己的 worker
    on_task_started()
    workers.on_task_finished()
    _orm_queue(MAIN, (INGEST, "big"))
    assert _names(main.dequeue()) == ["big"]  # 自己的队列有任务时先做自己的
    on_task_started()
    workers.on_task_finished()
    assert _names(main.dequeue()) == ["small-2"]
    on_task_started()
    workers.on_task_finished()
    assert main.dequeue() is None
    # 快队列自己的 worker 照常取它队列里剩下的（被分担走的那些已被锁定）
    assert _names(SharingORM(list_key=FAST).dequeue()) == ["cleanup"]


def test_fast_queue_never_takes_main_queue_work(db, board: WorkerBoard) -> None:
    _orm_queue(MAIN, (INGEST, "big"))
    on_worker_ready()
    assert SharingORM(list_key=FAST).dequeue() is None
    assert SharingORM(list_key=MAIN).queue_size() == 1  # 还在主队列里，没有被锁定


def test_sharing_can_be_switched_off(db, board: WorkerBoard, settings: Any) -> None:
    settings.QUEUE_MAIN_TAKES_FAST = False
    _orm_queue(FAST, (INGEST, "small"))
    on_worker_ready()
    assert SharingORM(list_key=MAIN).dequeue() is None


def test_without_a_board_the_broker_behaves_like_django_q(db, monkeypatch: pytest.MonkeyPatch) -> None:
    """不是经本项目 qcluster 启动的进程（没有忙闲表）：照常取自己的队列，不分担（不知道有没有 worker 空着）。"""
    monkeypatch.setattr(Conf, "POLL", 0.05)
    _orm_queue(FAST, (INGEST, "small"))
    _orm_queue(MAIN, (INGEST, "big"))
    main = SharingORM(list_key=MAIN)
    assert _names(main.dequeue()) == ["big"]
    assert main.dequeue() is None


@pytest.mark.process
def test_redis_broker_follows_the_same_rules(board: WorkerBoard, redis_url: str,  # noqa: F811
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Conf, "REDIS", redis_url)
    main, fast = SharingRedis(list_key=MAIN), SharingRedis(list_key=FAST)
    for broker, tasks in ((fast, [(CLEANUP, "cleanup"), (INGEST, "small")]), (main, [])):
        for func, name in tasks:
            broker.enqueue(_package(func, name))
    assert main.dequeue() is None  # 没有空闲 worker
    on_worker_ready()
    assert main.dequeue() is None  # 快队列的队首是清理：不取，也不动它
    assert _names(fast.dequeue()) == ["cleanup"]
    on_task_started()
    workers.on_task_finished()
    assert _names(main.dequeue()) == ["small"]
    on_task_started()
    workers.on_task_finished()
    main.enqueue(_package(INGEST, "big"))
    assert fast.dequeue() is None  # 快队列从不取主队列的任务
    assert _names(main.dequeue()) == ["big"]
