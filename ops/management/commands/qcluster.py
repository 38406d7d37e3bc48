"""manage.py qcluster：django-q2 自带的命令，外加两点：

- 在关闭翻译的状态下运行。django-q2 用 gettext 按 LANGUAGE_CODE（zh-hans）翻译自己的日志行，结果 worker
  日志里中文句子与我们的英文事件名混在一起，既不好读也不好检索。哨兵、监视器与 worker 进程都由本进程
  fork 出来并继承这一设置，所以整个集群的日志都是英文。管理后台的中文界面不受影响。
- 同时启动快队列集群（RAG_QUEUE_FAST_WORKERS 个 worker）作为子进程：知识库清理、孤儿回收与小文件摄取
  走快队列，主队列的 worker 全在跑长摄取时它们也不必排队。子进程与本进程同在一个进程组：本进程正常停止时
  先 SIGTERM 它、限时等待后 SIGKILL；整组停止（serve、容器运行时）时它一并收到信号。
  快队列另行部署时加 ``--no-fast-queue``，另起 ``Q_CLUSTER_NAME=ragservice-fast manage.py qcluster``。
- 把自己的 nice 值调到 ``RAG_WORKER_NICE``（默认 10），哨兵、worker 与快队列子进程都继承。web 与 worker 同机时，
  CPU 上的 embedding（摄取）会把检索挤到排队：2 核机器上 3 篇文档持续摄取时检索 p95 是空闲时的 8.6 倍
  （bench/README.md“负载与干扰”）。调低优先级后 CPU 空闲时摄取照样用满，检索一来就先让给检索。
- 启动集群的那一段包在 ``infra.workers.starting_cluster`` 里：建立 worker 的忙闲表（代理只在有空闲 worker 时取任务，
  主队列空闲时帮快队列做小文件，见 ``infra.broker``），并让停止信号成为优雅停止——worker 在下一个检查点交还手上的
  摄取、原样重新入队，而不是像被杀一样留下过期的租约（GRACEFUL-STOP-NOT-A-DEATH）。
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser, no_translations
from django_q.conf import Conf
from django_q.management.commands.qcluster import Command as QclusterCommand

from infra.workers import starting_cluster

# 主集群停下后，再等快队列子进程停下的秒数，之后 SIGKILL。它通常早已停好：整组停止时它与主集群同时收到 SIGTERM，
# 只有主进程收到信号时由 infra.workers 转发给它；它的 worker 在下一个检查点交还手上的摄取
FAST_QUEUE_STOP_SECONDS = 30


class Command(QclusterCommand):
    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--no-fast-queue", action="store_true",
                            help="只启动主队列集群，快队列（清理、小文件）另行部署")

    @no_translations
    def handle(self, *args: Any, **options: Any) -> None:
        lower_priority(settings.WORKER_NICE)
        fast = None
        if not (options["no_fast_queue"] or Conf.CLUSTER_NAME == settings.FAST_QUEUE):
            # 在 starting_cluster 屏蔽 SIGTERM 之前启动：子进程要带着正常的信号屏蔽字开始
            fast = subprocess.Popen(  # noqa: S603 - 参数全部由本程序构造
                [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "qcluster"],
                env={**os.environ, "Q_CLUSTER_NAME": settings.FAST_QUEUE},
            )
        try:
            with starting_cluster(Conf.WORKERS):
                super().handle(*args, **options)
            # django-q2 的 handle 启动哨兵进程后立即返回（由解释器退出时 join 它）：先等主集群停下，再停快队列
            for process in multiprocessing.active_children():
                process.join()
        finally:
            if fast is not None:
                stop_fast_queue(fast)


def stop_fast_queue(fast: subprocess.Popen[bytes]) -> None:
    """主集群停下后停快队列集群：SIGTERM（它的 worker 在检查点交还手上的活），限时等待，之后 SIGKILL。"""
    if fast.poll() is None:
        fast.send_signal(signal.SIGTERM)
    try:
        fast.wait(FAST_QUEUE_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        fast.kill()
        fast.wait()


def lower_priority(nice: int) -> None:
    """把本进程的 nice 值调到 ``nice``（只调低优先级：已经更低的不动，非特权进程也调不回去）。"""
    if nice > os.getpriority(os.PRIO_PROCESS, 0):
        os.setpriority(os.PRIO_PROCESS, 0, nice)
