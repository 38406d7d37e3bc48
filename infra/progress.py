"""管理命令共用的单行进度条。"""

from __future__ import annotations

import time
from typing import Any


def write_progress(stream: Any, done: int, total: int, started: float, unit: str) -> None:
    """在同一行刷新 ``[###...] done/total  速率``；``stream`` 是命令的 ``self.stdout``。"""
    width = 30
    filled = int(width * done / max(total, 1))
    rate = done / max(time.monotonic() - started, 1e-6)
    stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  {rate:.2f} {unit}/秒", ending="")
    stream.flush()
