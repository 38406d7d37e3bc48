"""基准报告里的“哪台机器”：主机名、核数与 CPU 型号。

同样的基准在两台 2 核的开发 VM 上能差 3~4 倍（``bench/pages/e2e_search.md``，AMD EPYC 对 Intel Xeon），只写主机名
与核数时看不出两次运行是不是同一种机器，数字就会被错误地并排比较。
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

_CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = _CPUINFO) -> str:
    """CPU 型号（Linux 读 ``/proc/cpuinfo`` 的第一个 ``model name``；读不到时退回 :func:`platform.processor`）。"""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "未知 CPU"


def describe() -> str:
    """一行机器描述：``主机名，N 核，CPU 型号``。"""
    return f"{platform.node()}，{os.cpu_count()} 核，{cpu_model()}"
