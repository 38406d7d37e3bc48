"""gunicorn 配置（由 manage.py serve 传入 --config）。"""

import os
from typing import Any

from django.conf import settings

from ops.logging import logging_dict

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")

# gunicorn 主进程自己的日志（启动、worker 重启）也输出为 JSON 行，级别与格式取自 RAG_LOG_*
logconfig_dict = logging_dict(level=settings.LOG_LEVEL, fmt=settings.LOG_FORMAT)


def child_exit(server: Any, worker: Any) -> None:
    """多进程 Prometheus：worker 退出时把它的指标文件标记为已死亡，避免 gauge 残留。"""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def post_worker_init(worker: Any) -> None:
    """预加载默认 embedding 模型与全文检索的切词词典，免得第一个检索请求替所有人付这笔开销。"""
    from ops.warmup import load_models

    load_models(ocr=False)
