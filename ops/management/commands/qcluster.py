"""manage.py qcluster：django-q2 自带的命令，只是在关闭翻译的状态下运行。

django-q2 用 gettext 按 LANGUAGE_CODE（zh-hans）翻译自己的日志行，结果 worker 日志里中文句子与我们的英文
事件名混在一起，既不好读也不好检索。哨兵、监视器与 worker 进程都由本进程 fork 出来并继承这一设置，
所以整个集群的日志都是英文。管理后台的中文界面不受影响（web 进程按请求激活语言）。
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import no_translations
from django_q.management.commands.qcluster import Command as QclusterCommand


class Command(QclusterCommand):
    @no_translations
    def handle(self, *args: Any, **options: Any) -> None:
        super().handle(*args, **options)
