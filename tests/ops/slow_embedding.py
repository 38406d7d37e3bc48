"""给真实 worker 进程用的“慢模型”：embedding 走 127.0.0.1 上的假 OpenAI 服务，每个请求先睡 ``delay`` 秒。

摄取在 embed 阶段停留多久由测试决定（每片 ``RAG_EMBEDDING_BATCH_SIZE`` 条文本一个请求），worker 也不必加载真实模型
（预热只向这个服务探测一次维度），一个 qcluster 十几秒就能接活。停止服务用 ``graceful_stop``：与 ``manage.py serve``
同一套信号（SIGTERM，宽限期内等进程组退空，仍在的 SIGKILL）。
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import time
from typing import Any

import numpy as np
import psutil

from documents.models import Document
from documents.services import document_upload
from knowledge.models import KnowledgeBase
from ops.management.commands.serve import STOP_SECONDS, group_alive
from ops.warmup import worker_warm_states
from tests.fake_http import FakeJsonServer
from tests.workers import WorkerCluster

DIMENSION = 384
MODEL = "slow-embed"
PARAGRAPH = "本项目为政务云平台建设项目，投标人须具备相应资质，投标文件应包括商务部分和技术部分。"


class SlowEmbeddingServer(FakeJsonServer):
    """OpenAI 风格的 ``/v1/embeddings``：按文本生成确定性的 384 维向量，每个请求先睡 ``delay`` 秒。"""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def respond(self, path: str, body: Any, claimed: Any) -> tuple[int, Any]:
        if path != "/v1/embeddings":
            return 404, {"error": "Not Found"}
        data = [{"object": "embedding", "index": i, "embedding": _vector(text)} for i, text in enumerate(body["input"])]
        return 200, {"object": "list", "data": data, "model": body.get("model")}

    def embed_requests(self) -> int:
        with self.lock:
            return len(self.requests)

    def worker_env(self, **extra: str) -> dict[str, str]:
        """worker 进程的环境：默认提供方就是这个服务（预热不加载真实模型），每片 8 条文本。"""
        return {"RAG_EMBEDDING_PROVIDER": "http", "RAG_EMBEDDING_MODEL": MODEL, "RAG_EMBEDDING_URL": self.url,
                "RAG_EMBEDDING_BATCH_SIZE": "8", "RAG_RERANK_PROVIDER": "none", **extra}


def _vector(text: str) -> list[float]:
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(text)) % (2**32)
    return [float(x) for x in np.random.default_rng(seed).normal(size=DIMENSION)]


def slow_kb(kb_factory: Any, *, chunk_size: int) -> KnowledgeBase:
    kb: KnowledgeBase = kb_factory(embedding_provider="http", embedding_model=MODEL, embedding_dimension=DIMENSION,
                                   chunking={"strategy": "token", "chunk_size": chunk_size, "overlap": 0})
    return kb


def sections(count: int, *, tag: str = "") -> str:
    """``count`` 节互不相同的正文（每节约 390 字节）：2,800 节约 1.1 MB，超过快队列的 1 MB 上限。"""
    return "\n\n".join(f"## {tag}第{i}节\n\n{PARAGRAPH * 3}" for i in range(count))


def upload(kb: KnowledgeBase, name: str, text: str, **chunking: Any) -> Document:
    """经上传服务入队（提交后进 ORM 队列，由子进程 worker 执行）。"""
    document: Document = document_upload(kb=kb, filename=name, upload=io.BytesIO(text.encode()), metadata={},
                                         chunking=chunking)
    return document


def warm_workers(cluster: WorkerCluster) -> int:
    """这个 qcluster 进程树里已登记预热完成的 worker 数（与 /ready 读的是同一份记录）。"""
    assert cluster.proc is not None
    try:
        pids = [child.pid for child in psutil.Process(cluster.proc.pid).children(recursive=True)]
    except psutil.Error:
        return 0
    host = os.uname().nodename
    return sum(1 for state in worker_warm_states([(host, pid) for pid in pids]) if state.ok)


def graceful_stop(cluster: WorkerCluster, *, whole_group: bool = True, grace: float = STOP_SECONDS) -> float:
    """像 ``manage.py serve`` 那样停止一个 qcluster：SIGTERM，宽限期内等进程组退空，仍在的 SIGKILL。

    ``whole_group`` 为真时 SIGTERM 发给整个进程组（serve、systemd），否则只发给 qcluster 进程（容器里的 PID 1）。
    返回进程组退空用了几秒；宽限期到了还有进程就 SIGKILL 它们并返回 ``inf``（那就不是优雅停止了）。
    """
    assert cluster.proc is not None
    pid = cluster.proc.pid
    started = time.monotonic()
    if whole_group:
        os.killpg(pid, signal.SIGTERM)
    else:
        os.kill(pid, signal.SIGTERM)
    while time.monotonic() - started < grace:
        cluster.proc.poll()  # 收尸，否则组长一直是僵尸
        if not group_alive(pid):
            return time.monotonic() - started
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    cluster.proc.wait(10)
    return float("inf")
