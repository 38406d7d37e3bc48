"""管理命令共用的部件：单行进度条，以及收到停止信号时做完当前单元再停。"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


def write_progress(stream: Any, done: int, total: int, started: float, unit: str) -> None:
    """在同一行刷新 ``[###...] done/total  速率``；``stream`` 是命令的 ``self.stdout``。"""
    width = 30
    filled = int(width * done / max(total, 1))
    rate = done / max(time.monotonic() - started, 1e-6)
    stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  {rate:.2f} {unit}/秒", ending="")
    stream.flush()


@dataclass
class StopRequest:
    """命令运行期间是否收到了 SIGTERM / SIGINT。"""

    requested: bool = False


@contextmanager
def graceful_stop() -> Iterator[StopRequest]:
    """期间 SIGTERM / SIGINT 只记下“请求停止”，由命令在两个工作单元之间检查（当前单元做完再停，不留半截状态）；
    退出时恢复原来的处理器——不恢复的话，在同一进程里调用过命令的测试或脚本再也无法用信号停下来。
    处理器只能装在主线程里：在别的线程里调用时不装（信号照常按原来的方式处理）。"""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def request_stop(signum: int, frame: Any) -> None:
        stop.requested = True

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
