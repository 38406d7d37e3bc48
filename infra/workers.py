"""django-q2 集群里 worker 进程的两份共享状态：忙闲表（代理据此决定取不取任务）与停止请求（优雅停止）。

**忙闲表**（``WorkerBoard``，见 docs/INVARIANTS.md 的 ``IDLE-WORKER-TAKES-WORK``）：qcluster 在 fork 哨兵之前
建立一小块共享内存，哨兵、pusher 与 worker 都经 fork 继承它。worker 在启动（预热完）、开始任务、做完任务时
写下自己的状态；pusher 里的代理（``infra.broker``）只在有 worker 空着、且上一个交出的任务已被取走时才从队列
取任务。于是任务不会被预取进一个忙着的集群的本地队列里干等，空闲的主队列 worker 也可以放心地去取快队列的
小文件（取到就有人马上做）。每个 worker 只写自己的槽；pusher 只读，不加锁，进程被杀也不会留下一把没人放的锁。

**优雅停止**（见 ``GRACEFUL-STOP-NOT-A-DEATH``）：django-q2（1.11）自己的停止是主进程收到 SIGTERM/SIGINT 后置位
``stop_event``，哨兵停掉 pusher、往任务队列里放 STOP、等 worker 做完手上的任务。与我们的部署方式有两处不合：

1. 哨兵把 SIGTERM 设回默认处理（``SIG_DFL``），pusher、监视器与 worker 都继承它。``manage.py serve``、systemd、
   容器运行时停止服务时向整个进程组发 SIGTERM：哨兵与 worker 当场死掉，有序停止根本没机会执行，正在摄取的
   文档留下一份要等到期才失效的租约，回收器把它记成一次“弄死 worker”；
2. 只有主进程收到信号时（容器里的 PID 1、supervisord），worker 不知道要停，会把手上的文档整个做完，进程管理器
   的宽限期一过就被 SIGKILL——同样留下过期的租约。

这里的做法：

- ``starting_cluster``：qcluster fork 哨兵时屏蔽 SIGTERM，哨兵、pusher、监视器继承这个屏蔽，整组收到的 SIGTERM
  对它们不起作用，停止仍由主进程按 django-q2 的顺序驱动；主进程的 SIGTERM/SIGINT 处理函数前面加一步：先把 SIGTERM
  转给忙闲表上的 worker 与直接子进程（快队列集群），只转一次；
- ``on_worker_spawn``：worker 一启动就解除屏蔽、装上自己的处理函数——SIGTERM 只记下“要停了”（``stop_requested``），
  并结束 worker 自己的子进程（解析沙箱：它的半截结果本来就要作废，不必等它解析完）。摄取在下一个检查点看到它，
  交还租约、原样重新入队（``documents.ingestion``）；任务返回后 worker 按 django-q2 的“回收”退出
  （``on_task_finished``），不再取新任务。只有标了 ``stops_at_checkpoints`` 的任务函数（摄取）这样做；正在跑别的
  任务（清理、索引同步：没有检查点，靠自己的续跑机制）的 worker 与以前一样收到 SIGTERM 就结束，停止不必等它们；
- 收到停止信号的 worker 最多再活 ``WORKER_STOP_SECONDS``：没人来 SIGKILL 时（终端里 Ctrl-C、django-q2 在任务超时后
  对 worker 的 terminate），它自己结束，不会无限期地占着。

只在 qcluster 启动的进程里生效（``starting_cluster`` 置位的模块变量经 fork 继承）：同步模式下 django-q2 在 web 或
测试进程里直接调用 worker 函数，也会发 post_spawn，那里的信号处理一概不动。
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import Lock, RawArray, RawValue
from typing import Any, TypeVar

import psutil
import structlog

logger = structlog.get_logger(__name__)

# 收到停止信号的 worker 最多再活这么久（秒）；到点仍未退出就自行 SIGKILL（租约到期后算一次 worker 死亡）。
# 比 manage.py serve 的宽限期（60 秒）长：有人负责收尾时由他决定何时 SIGKILL，这里只兜底没人收尾的情形
WORKER_STOP_SECONDS = 90
# 代理交出一个任务后，最多等这么久（秒）看它被某个 worker 取走；超过就当它已丢失（交出后 worker 恰好死了），照常取下一个
HANDOFF_SECONDS = 5.0
# 等空闲 worker 时的轮询间隔（秒）：worker 做完任务到代理交出下一个任务的延迟上限
_BOARD_POLL_SECONDS = 0.05


class WorkerBoard:
    """一个集群里 worker 的忙闲（共享内存）。

    ``pids`` 每个槽一个 worker：``+pid`` 空着等任务，``-pid`` 正在执行任务，``0`` 空槽。worker 第一次写状态时
    （持锁，限时）占一个空槽或死进程留下的槽，之后只写自己的槽。``handed`` 是代理最近一次交出、还没有 worker
    开始执行的任务的时刻（``time.monotonic``，同一台机器上各进程一致；0 表示没有）。
    """

    def __init__(self, slots: int) -> None:
        self.pids = RawArray("i", slots)
        self.handed = RawValue("d", 0.0)
        self._claim_lock = Lock()

    def claim(self, pid: int) -> int | None:
        """为 ``pid`` 占一个槽，返回槽号；表满时返回 None（这个 worker 不上表，代理只是少算一个空闲 worker）。

        锁一秒内拿不到（持锁的进程恰好被杀，锁再也不会放开）时不加锁照样占：两个 worker 偶尔抢到同一个槽，
        输的一方下次写状态时发现槽里不是自己（``_mark``）就另占一个；绝不会因为一把死锁让整个集群不再取任务。
        """
        locked = self._claim_lock.acquire(timeout=1.0)
        try:
            for index, value in enumerate(self.pids):
                if value == 0 or not _alive(abs(value)):
                    self.pids[index] = pid
                    return index
            return None
        finally:
            if locked:
                self._claim_lock.release()

    def workers(self) -> list[int]:
        """表上所有 worker 的 pid（空闲的与忙的）。"""
        return [abs(value) for value in self.pids if value != 0]

    def free_worker(self) -> bool:
        """有活着的 worker 空着，且上一个交出的任务已被取走（或交出已超过 HANDOFF_SECONDS）。"""
        handed = self.handed.value
        if handed and time.monotonic() - handed < HANDOFF_SECONDS:
            return False
        return any(value > 0 and _alive(value) for value in self.pids)

    def wait_for_free_worker(self, timeout: float) -> bool:
        """最多等 ``timeout`` 秒，直到 ``free_worker``；pusher 每次取任务前调用，返回不晚于 timeout，停止时不拖延。"""
        deadline = time.monotonic() + timeout
        while not self.free_worker():
            if time.monotonic() >= deadline:
                return False
            time.sleep(_BOARD_POLL_SECONDS)
        return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# 以下模块变量在 qcluster 主进程里设置，经 fork 传给哨兵、pusher 与 worker；在其他进程里保持初值
_board: WorkerBoard | None = None
_in_cluster = False
# worker 进程自己的状态
_slot: int | None = None
_stopping = False
_stop_event = threading.Event()
# 正在执行的任务：None 空闲；True 会在检查点停下的任务；False 别的任务
_running: bool | None = None
# qcluster 主进程已在处理停止信号
_stop_handled = False


_GRACEFUL = "stops_at_checkpoints"
F = TypeVar("F", bound=Callable[..., Any])


def stops_at_checkpoints(func: F) -> F:
    """标记一个 django-q2 任务函数：它在检查点查看 ``stop_requested``，收到停止信号时自己交还工作、重新入队。
    执行它的 worker 收到 SIGTERM 时不当场结束，而是等它返回。"""
    setattr(func, _GRACEFUL, True)
    return func


def board() -> WorkerBoard | None:
    """本集群的忙闲表；不在 qcluster 启动的进程里时为 None（代理据此退回 django-q2 原来的行为）。"""
    return _board


def stop_requested() -> bool:
    """本 worker 已收到停止信号：手上的摄取应在下一个检查点交还租约、原样重新入队。"""
    return _stopping


def request_stop() -> None:
    """记下“要停了”，并让出忙闲表上的槽。SIGTERM 处理函数调用它；测试直接调用它模拟停止信号。

    在信号处理函数里执行：先写一个普通的布尔变量（单条字节码，不会与自己嵌套的第二次调用抢锁），再做其余的事。
    """
    global _stopping
    if _stopping:
        return
    _stopping = True
    _leave_board()
    _stop_event.set()


def reset_stop() -> None:
    """撤销 ``request_stop``（测试用）。"""
    global _stopping
    _stopping = False
    _stop_event.clear()


@contextmanager
def starting_cluster(workers: int) -> Iterator[None]:
    """包住 qcluster 启动 django-q2 集群（``Cluster().start()``）的那一段。

    建立忙闲表、屏蔽 SIGTERM 后 fork 出的哨兵及其 pusher、监视器、worker 都继承屏蔽（worker 在 ``on_worker_spawn``
    里自己解除）；集群启动后，在 django-q2 装好的 SIGTERM/SIGINT 处理函数前加上转发，最后恢复本进程的屏蔽——
    屏蔽期间到达的 SIGTERM 此时才送达，经过转发。
    """
    global _board, _in_cluster
    _in_cluster = True
    _board = WorkerBoard(slots=2 * workers + 2)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
        for signum in (signal.SIGTERM, signal.SIGINT):
            _forward_before(signum)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _forward_before(signum: int) -> None:
    handler = signal.getsignal(signum)

    def forward_then_stop(number: int, frame: Any) -> None:
        # 只处理第一个停止信号。整组停止时同一个进程几乎同时收到两三个 SIGTERM（进程组的、上一级 qcluster 转发的、
        # 主集群停下后又发给快队列的）：django-q2 的处理函数在第一次 stop() 里持着 stop_event 的锁时被第二个信号
        # 打断、再进 stop()，就在那把不可重入的锁上把自己锁死，集群再也停不下来
        global _stop_handled
        if _stop_handled:
            return
        _stop_handled = True
        _forward_stop()
        if callable(handler):
            handler(number, frame)

    signal.signal(signum, forward_then_stop)


def _forward_stop() -> None:
    """把 SIGTERM 转给本集群的 worker 与直接子进程（快队列集群）。"""
    targets = set(_board.workers() if _board is not None else [])
    with contextlib.suppress(psutil.Error):
        # 直接子进程里的哨兵屏蔽了 SIGTERM，收到也不受影响；快队列集群的主进程照同样的办法停它自己的 worker
        targets.update(child.pid for child in psutil.Process().children())
    for pid in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)


# ---------------------------------------------------------------- worker 进程里的信号接收者（ops.apps 连接）


def on_worker_spawn(**_: Any) -> None:
    """post_spawn（worker 启动，预热之前）：装上停止信号的处理函数、解除继承来的屏蔽，启动看门狗。

    只在 qcluster 派生的 worker 进程里（它的主线程）做：同步模式下 post_spawn 也会在 web 进程的请求线程里发出，
    那里既不是 worker，也不能装信号处理函数。"""
    if not _in_cluster or threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    threading.Thread(target=_watchdog, daemon=True, name="stop-watchdog").start()


def on_worker_ready(**_: Any) -> None:
    """post_spawn（预热之后）：上表，标为空闲。预热完才算空闲：代理不会把任务交给一个还要加载二十秒模型的 worker。"""
    _mark(busy=False)


def on_task_started(func: Any = None, **_: Any) -> None:
    """pre_execute：记下任务会不会在检查点停下；标为忙，交出的任务已被取走。"""
    global _running
    _running = bool(getattr(func, _GRACEFUL, False))
    _mark(busy=True)
    if _board is not None:
        _board.handed.value = 0.0


def on_task_finished(**_: Any) -> None:
    """post_execute_in_worker：标回空闲；已收到停止信号时改为让这个 worker 退出。

    退出走 django-q2 自己的“回收”路径：worker 交出结果（监视器照常确认这条消息）之后检查 ``rss_check()``，
    把本进程的 ``Conf.MAX_RSS`` 设为 1 KB 就让检查成立，worker 离开循环、正常退出；集群在停止时不再补人，
    没有停止（只有这个 worker 收到了信号）时哨兵补一个新的。
    """
    global _running
    _running = None
    if not _stopping:
        _mark(busy=False)
        return
    if _in_cluster:
        from django_q.conf import Conf

        Conf.MAX_RSS = 1


def _mark(*, busy: bool) -> None:
    global _slot
    if _board is None or _stopping:
        return
    pid = os.getpid()
    if _slot is None or abs(_board.pids[_slot]) != pid:
        _slot = _board.claim(pid)
        if _slot is None:
            return
    _board.pids[_slot] = -pid if busy else pid


def _leave_board() -> None:
    if _board is not None and _slot is not None and abs(_board.pids[_slot]) == os.getpid():
        _board.pids[_slot] = 0


def _on_sigterm(signum: int, frame: Any) -> None:
    if _running is False:
        # 正在跑不会在检查点停下的任务（清理、索引同步）：与以前一样当场结束，它们由自己的续跑机制接着做
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    first = not _stopping
    request_stop()
    if first:
        # 解析沙箱等子进程：它们的结果随这次尝试一起作废。先记下停止、再结束它们，worker 看到子进程退出时
        # 已经知道原因，不会把它当成文件的错
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children():
                with contextlib.suppress(psutil.Error):
                    child.terminate()


def _watchdog() -> None:
    _stop_event.wait()
    time.sleep(WORKER_STOP_SECONDS)
    logger.error("worker_stop_overdue", seconds=WORKER_STOP_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)
