"""进程预热：django-q2 worker 在启动时加载 embedding 模型、OCR 引擎与全文词典；web 进程另加载重排序模型。

不预热时，每个 worker 处理第一个文档要多等约 20 秒（模型加载），后面的文档却不用——同样的文件耗时差一个
数量级，维护者会以为出了问题。预热结果按 worker 进程写进共享的数据库缓存（与 django-q2 心跳同一张表），
web 进程的 /ready 据此判断：在至少一个 worker 加载完模型之前，服务不算就绪。

重排序只在检索时用到，所以只有 web 进程预热它；不预热时每个 gunicorn worker 的第一个检索要替大家等
bge-reranker-v2-m3（2.3 GB）的加载。
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog
from django.conf import settings
from django.core.cache import caches

from infra.embedders import cached_hub_config, default_embedder
from raglib.analysis import warm_up as fulltext_warm_up
from raglib.parsing.ocr import ocr_warm_up
from raglib.providers.rerank import RerankUnavailable
from search.rerankers import configured_reranker

logger = structlog.get_logger(__name__)

WARM_KEY_PREFIX = "ragservice:warm:"


@dataclass(frozen=True)
class WarmState:
    """一个进程的预热结果；``loaded`` 是给人看的模型清单，``error`` 只有异常类名（细节在日志里）。"""

    ok: bool
    loaded: str
    seconds: float
    error: str = ""


def warm_key(host: str, pid: int) -> str:
    return f"{WARM_KEY_PREFIX}{host}:{pid}"


def load_models(*, ocr: bool, rerank: bool = False) -> WarmState:
    """加载默认 embedding 模型（以及 OCR 引擎、重排序模型）与全文切词词典；失败时记日志并返回 ok=False，不抛异常。

    重排序模型加载失败不算预热失败：检索照常可用（按融合顺序返回），只记一条警告；失败也计入它的断路器，
    与检索时懒加载失败的处理相同。
    """
    started = time.monotonic()
    try:
        embedder = default_embedder()
        loaded = [f"embedding {embedder.provider}:{embedder.model}"]
        if ocr:
            engine = ocr_warm_up(settings.OCR_ENGINE)
            loaded.append(f"OCR {engine or 'none'}")
        fulltext_warm_up()
    except Exception as exc:
        logger.exception("models_load_failed")
        return WarmState(ok=False, loaded="", seconds=round(time.monotonic() - started, 1),
                         error=type(exc).__name__)
    if rerank:
        loaded.extend(_warm_reranker())
    return WarmState(ok=True, loaded=", ".join(loaded), seconds=round(time.monotonic() - started, 1))


def _warm_reranker() -> list[str]:
    """加载配置的重排序模型；返回给人看的清单项（未配置、跳过或失败时为空）。

    flag 模型只在本机已有时预热（本地目录，或已在 Hugging Face 缓存里的 hub id）：启动时去下载 2 GB 多的模型会让
    gunicorn worker 迟迟不能接请求、超过 worker 超时后被杀掉重启，反复如此；不能联网时还要先等 hub 的重试。
    没有的模型仍在第一次检索时加载（与不预热时相同）。
    """
    reranker = configured_reranker()
    if reranker is None:
        return []
    if reranker.provider == "flag" and not (Path(reranker.model).is_dir() or cached_hub_config(reranker.model)):
        logger.warning("rerank_warm_up_skipped", reranker=reranker.breaker.name,
                       reason="the model is neither a local directory nor in the Hugging Face cache")
        return []
    try:
        reranker.warm_up()
    except RerankUnavailable as exc:
        logger.warning("rerank_warm_up_failed", reranker=reranker.breaker.name, error=str(exc))
        return []
    return [f"rerank {reranker.provider}:{reranker.model}"]


def warm_worker(sender: Any = None, proc_name: str = "", **kwargs: Any) -> None:
    """django-q2 ``post_spawn`` 信号的接收者：在 worker 子进程里预热并登记结果。"""
    state = load_models(ocr=True)
    caches["cluster"].set(warm_key(socket.gethostname(), os.getpid()), asdict(state), timeout=None)
    if state.ok:
        logger.info("worker_models_loaded", worker=proc_name, loaded=state.loaded, seconds=state.seconds)


def worker_warm_states(workers: list[tuple[str, int]]) -> list[WarmState]:
    """给定 (主机, pid) 的 worker 中已登记预热结果的那些（仍在加载的不在列表里）。"""
    found = caches["cluster"].get_many([warm_key(host, pid) for host, pid in workers])
    return [WarmState(**state) for state in found.values()]
