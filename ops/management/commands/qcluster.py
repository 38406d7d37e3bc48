"""manage.py qcluster：django-q2 自带的命令，外加两点：

- 在关闭翻译的状态下运行。django-q2 用 gettext 按 LANGUAGE_CODE（zh-hans）翻译自己的日志行，结果 worker
  日志里中文句子与我们的英文事件名混在一起，既不好读也不好检索。哨兵、监视器与 worker 进程都由本进程
  fork 出来并继承这一设置，所以整个集群的日志都是英文。管理后台的中文界面不受影响。
- 同时启动快队列集群（RAG_QUEUE_FAST_WORKERS 个 worker）作为子进程：知识库清理、孤儿回收与小文件摄取
  走快队列，主队列的 worker 全在跑长摄取时它们也不必排队。子进程随本进程退出而退出（本进程正常停止时
  先 SIGTERM、限时等待后 SIGKILL；本进程被 SIGKILL 时由内核的 parent-death 信号通知它）。
  快队列另行部署时加 ``--no-fast-queue``，另起 ``Q_CLUSTER_NAME=ragservice-fast manage.py qcluster``。
"""

from __future__ import annotations

import contextlib
import ctypes
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

# 停止快队列子进程时等它处理完手头任务的秒数，之后 SIGKILL
FAST_QUEUE_STOP_SECONDS = 30
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """子进程在 exec 前设置：父进程死掉（哪怕是 SIGKILL）时内核给它发 SIGTERM，不留孤儿。"""
    # 非 Linux 没有 prctl：退回到只靠正常停止路径与进程组信号
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Command(QclusterCommand):
    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--no-fast-queue", action="store_true",
                            help="只启动主队列集群，快队列（清理、小文件）另行部署")

    @no_translations
    def handle(self, *args: Any, **options: Any) -> None:
        if options["no_fast_queue"] or Conf.CLUSTER_NAME == settings.FAST_QUEUE:
            super().handle(*args, **options)
            return
        fast = subprocess.Popen(  # noqa: S603 - 参数全部由本程序构造
            [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "qcluster"],
            env={**os.environ, "Q_CLUSTER_NAME": settings.FAST_QUEUE},
            preexec_fn=_die_with_parent,
        )
        try:
            super().handle(*args, **options)
        finally:
            if fast.poll() is None:
                fast.send_signal(signal.SIGTERM)
            try:
                fast.wait(FAST_QUEUE_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                fast.kill()
                fast.wait()
