"""gunicorn 配置（由 manage.py serve 传入 -c）。

多进程 Prometheus：worker 退出时把它的指标文件标记为已死亡，避免 gauge 残留。
"""

from typing import Any


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
