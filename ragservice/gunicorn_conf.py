"""gunicorn 配置（由 manage.py serve 传入 --config）。"""

import gc
import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from django.conf import settings
from gunicorn import util

from infra.logging import logging_dict

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")

# gunicorn 主进程自己的日志（启动、worker 重启）也输出为 JSON 行，级别与格式取自 RAG_LOG_*
logconfig_dict = logging_dict(level=settings.LOG_LEVEL, fmt=settings.LOG_FORMAT)

# 请求行与单个请求头的解析上限放宽到 gunicorn 允许的最大值附近：应用自己按 RAG_MAX_URL_LENGTH /
# RAG_MAX_HEADER_BYTES 检查（更小），超限的请求因此得到带请求 ID 的统一错误格式（414 / 431）
limit_request_line = 8190
limit_request_field_size = 65536
limit_request_fields = 200

# gunicorn 在解析阶段拒绝的请求（超过上面的上限、非法请求行等）不经过 Django，原本回一个 HTML 页；
# 这里把它写出的错误响应换成项目的统一错误格式。消息固定，不回显请求内容
_FRONT_ERROR_CODES = {400: "VALIDATION_ERROR", 403: "PERMISSION_DENIED", 414: "URI_TOO_LONG",
                      431: "HEADERS_TOO_LARGE", 500: "INTERNAL_ERROR"}


def write_json_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    """``gunicorn.util.write_error`` 的替身：同样的状态码与原因短语，响应体是统一错误格式的 JSON。"""
    request_id = str(uuid.uuid4())
    code = _FRONT_ERROR_CODES.get(status_int, "VALIDATION_ERROR" if status_int < 500 else "INTERNAL_ERROR")
    body = json.dumps({"error": {"code": code, "message": reason, "request_id": request_id,
                                 "details": []}}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-Request-ID: {request_id}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin1") + body)


# worker 在 fork 前的主进程里载入本配置，之后按属性查找 util.write_error，所以替换对所有 worker 生效
util.write_error = write_json_error


def child_exit(server: Any, worker: Any) -> None:
    """多进程 Prometheus：worker 退出时把它的指标文件标记为已死亡，避免 gauge 残留。"""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


# 预热期间每隔这么多秒向主进程报一次活（gunicorn worker 的 notify）；最多报这么久，真卡死的加载仍会被超时杀掉
WARM_UP_HEARTBEAT_SECONDS = 5.0
WARM_UP_HEARTBEAT_LIMIT = 600.0


def post_worker_init(worker: Any) -> None:
    """在接第一个请求之前预加载：默认 embedding 模型的查询引擎与文档批量引擎（条目写入在请求里同步 embedding；
    ``RAG_WEB_DOCUMENT_ENGINE=false`` 的只读部署不加载）、分块 tokenizer、重排序模型、全文检索的切词词典与 URLconf，
    免得第一个检索或条目 PUT 替所有人付这笔开销。任务在 web 进程里同步执行（``RAG_QUEUE_SYNC=true``）时连同
    OCR 引擎（与文档批量引擎）。"""
    # gunicorn 在 Django 初始化之前加载本配置文件：用到 Django 的模块只能在 worker 初始化之后的钩子里导入
    from django.conf import settings
    from django_q.conf import Conf

    from ops.warmup import load_models, load_urlconf

    # 主进程按 --timeout（120 s）杀掉不报活的 worker，而预热期间 worker 还没进入会报活的主循环。机器忙时加载 torch
    # 引擎可能要上百秒（外部探测里第一个文档的 embed 用了 118 s，大半是加载），不报活就会被杀、重启、再加载，永远起不来
    stop = threading.Event()
    notify = getattr(worker, "notify", None)

    def heartbeat() -> None:
        deadline = time.monotonic() + WARM_UP_HEARTBEAT_LIMIT
        while not stop.wait(WARM_UP_HEARTBEAT_SECONDS) and time.monotonic() < deadline:
            if notify is not None:
                notify()

    beat = threading.Thread(target=heartbeat, name="warm-up-heartbeat", daemon=True)
    beat.start()
    try:
        load_models(ocr=Conf.SYNC, rerank=True, documents=settings.WEB_DOCUMENT_ENGINE or Conf.SYNC)
        load_urlconf()
    finally:
        stop.set()
        beat.join()
    # 加载完模型与框架，进程里有十几万个从此不再释放的对象；每次完整的分代回收都要把它们全扫一遍
    # （2 核机器上约 50 ms，正好卡在某个检索请求中间，剖析里表现为融合那一行的长时间停顿）。
    # 冻结它们之后，完整回收只看启动之后分配的对象
    gc.collect()
    gc.freeze()
