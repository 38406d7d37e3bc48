"""冷启动：新起的服务里，第一个文档的 embed、第一个条目 PUT、第一次 MCP 检索是否与之后的一样快（issue #23 第 3 项）。

用法（项目根目录）：
    .venv/bin/python bench/warmup.py [--documents 10] [--items 10] [--searches 10] [--web-workers 1]
                                     [--rerank none] [--skip-mcp]

在当前配置的数据库里（默认内嵌 PostgreSQL，先自动迁移）起全新的进程：一个 gunicorn（项目的 ``gunicorn_conf``，
命令行与 ``manage.py serve`` 相同）与一个 ``manage.py qcluster``，之后依次：

- **条目 PUT**：``/ready`` 答 200 之后（``--no-wait-ready``：web 进程一答 ``/health`` 就开始）经 HTTP 逐个 PUT
  ``--items`` 个一块的条目，记每个的墙钟耗时；
- **文档**：接着逐个上传 ``--documents`` 个一块的小 Markdown，等每个 completed，
  读 ``stage_timings`` 的 ``embed_ms`` 与 ``chunk_ms``，以及 202 → completed 的秒数；
- **MCP**：起 ``manage.py mcp``（stdio），记从启动到 initialize 答复的秒数，再逐次 ``search_knowledge``
  ``--searches`` 次；
- 另记：gunicorn 从启动到答 ``/health`` 的秒数与那一刻 worker 进程的 RSS，``/ready`` 第一次答 200 的秒数
  （后台线程每 0.5 秒问一次），最后打印 ``/ready`` 的 ``warm``（web 进程与 worker 已预热的引擎）。

每组报告第 1 个、第 10 个（或最后一个）与其余的中位数，以及“第 1 个 ÷ 第 10 个”。目标：第 1 个不超过第 10 个的 2 倍。
所有子进程的 ``RAG_RERANK_PROVIDER`` 取 ``--rerank``（默认 none：默认的 bge-reranker-v2-m3 不在本机缓存里时，
每个进程的第一次检索会去 Hugging Face 下载并重试，量的就不是预热了）。结束时删除知识库与 API key、停止进程。
不需要 ../shared 数据。
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from django_setup import setup_django

ROOT = setup_django(RAG_QUEUE_SYNC="false")

import anyio  # noqa: E402
import psutil  # noqa: E402
import requests  # noqa: E402
from django.core.management import call_command  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

from documents.models import Document  # noqa: E402
from documents.services import document_upload  # noqa: E402
from infra.principal import SYSTEM_PRINCIPAL  # noqa: E402
from knowledge.models import CleanupTask  # noqa: E402
from knowledge.services import knowledge_base_create, knowledge_base_delete  # noqa: E402
from ops.management.commands.serve import stop_groups, web_command  # noqa: E402
from ops.models import ApiKey  # noqa: E402

SENTENCE = "本项目为政务云平台建设项目，投标人须具备相应资质，投标文件应包括商务部分和技术部分。"


def _wait(done: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.1) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if done():
            return time.monotonic() - started
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout} s waiting for {what}")


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def _row(name: str, values: list[float], unit: str) -> str:
    """``| 名称 | 第 1 个 | 第 10 个 | 其余中位数 | 第 1 ÷ 第 10 | 全部 |``。"""
    first, tenth = values[0], values[min(9, len(values) - 1)]
    rest = statistics.median(values[1:]) if len(values) > 1 else float("nan")
    listed = ", ".join(f"{v:.0f}" if unit == "ms" else f"{v:.1f}" for v in values)
    fmt = "{:.0f}" if unit == "ms" else "{:.2f}"
    return (f"| {name} | {fmt.format(first)} | {fmt.format(tenth)} | {fmt.format(rest)} | "
            f"{first / tenth:.2f} | {listed} |")


def _rss_mb(proc: subprocess.Popen[bytes]) -> list[float]:
    """进程组里各子进程（gunicorn 的 worker）的 RSS（MB）。"""
    return [round(child.memory_info().rss / 2**20) for child in psutil.Process(proc.pid).children(recursive=True)]


class ReadyPoller(threading.Thread):
    """每 0.5 秒问一次 /ready，记下第一次答 200 的时刻（相对启动）。"""

    def __init__(self, url: str, launched: float) -> None:
        super().__init__(daemon=True)
        self.url, self.launched = url, launched
        self.ready_after: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            if _answers(self.url):
                self.ready_after = time.monotonic() - self.launched
                return


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _item_puts(base: str, key: str, kb_id: str, count: int) -> list[float]:
    elapsed = []
    headers = {"Authorization": f"Bearer {key}"}
    for number in range(count):
        started = time.perf_counter()
        # 客户端的默认超时是 30 秒；这里放宽，冷加载有多慢就记多慢
        response = requests.put(f"{base}/knowledge_bases/{kb_id}/items/warm-{number}", headers=headers, timeout=600,
                                json={"content": f"第{number}条。{SENTENCE}", "domain": "bench"})
        elapsed.append((time.perf_counter() - started) * 1000)
        if response.json().get("result") != "created":
            raise SystemExit(f"item PUT {number}: {response.status_code} {response.text[:300]}")
    return elapsed


def _finished(document_id: object) -> Callable[[], bool]:
    return lambda: Document.objects.get(pk=document_id).status != "processing"


def _documents(kb: Any, count: int) -> tuple[list[float], list[float], list[float]]:
    embed, chunk, total = [], [], []
    for number in range(count):
        text = f"# 第{number}篇\n\n第{number}篇。{SENTENCE}"
        started = time.monotonic()
        document = document_upload(kb=kb, filename=f"warm-{number}.md", upload=io.BytesIO(text.encode()),
                                   metadata={}, chunking={})
        _wait(_finished(document.pk), timeout=900, what=f"document {number}")
        total.append(time.monotonic() - started)
        done = Document.objects.get(pk=document.pk)
        if done.status != "completed":
            raise SystemExit(f"document {number} {done.status}: {done.error_message}")
        embed.append(float(done.stage_timings["embed_ms"]))
        chunk.append(float(done.stage_timings["chunk_ms"]))
    return embed, chunk, total


def _mcp(env: dict[str, str], key: str, kb_id: str, searches: int) -> tuple[float, list[float]]:
    """``manage.py mcp``：启动到 initialize 答复的秒数，与每次 search_knowledge 的毫秒数。"""
    params = StdioServerParameters(command=sys.executable, args=[str(ROOT / "manage.py"), "mcp", "--api-key", key],
                                   env=env, cwd=str(ROOT))
    queries = ["投标人资质", "商务部分", "政务云平台", "技术部分", "投标文件", "建设项目", "资质要求", "第3条",
               "平台建设", "文件组成"]

    async def run() -> tuple[float, list[float]]:
        started = time.perf_counter()
        with open(os.devnull, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                ready = time.perf_counter() - started
                elapsed = []
                for number in range(searches):
                    began = time.perf_counter()
                    result = await session.call_tool("search_knowledge", {
                        "knowledge_base_id": kb_id, "query": queries[number % len(queries)], "top_k": 3})
                    elapsed.append((time.perf_counter() - began) * 1000)
                    if result.is_error:
                        raise SystemExit(f"search_knowledge failed: {result.content}")
        return ready, elapsed

    return anyio.run(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=10)
    parser.add_argument("--items", type=int, default=10)
    parser.add_argument("--searches", type=int, default=10)
    parser.add_argument("--web-workers", type=int, default=1)
    parser.add_argument("--rerank", default="none", help="子进程的 RAG_RERANK_PROVIDER（默认 none）")
    parser.add_argument("--skip-mcp", action="store_true")
    parser.add_argument("--no-wait-ready", action="store_true",
                        help="gunicorn 一答 /health 就开始写（默认等 /ready 答 200：量的是“就绪之后的第一个请求”；"
                             "不等时第一批请求还要与正在预热的 worker 抢 CPU）")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    key = ApiKey(name=f"bench-warmup-{time.time_ns()}", access=ApiKey.Access.READ_WRITE, all_knowledge_bases=True)
    raw_key = key.set_new_key()
    key.save()
    kb = knowledge_base_create(principal=SYSTEM_PRINCIPAL, name=f"bench-warmup-{time.time_ns()}",
                               chunking={"strategy": "token", "chunk_size": 256, "overlap": 0})
    env = {**os.environ, "RAG_QUEUE_SYNC": "false", "RAG_RERANK_PROVIDER": args.rerank, "RAG_LOG_LEVEL": "warning"}
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    launched = time.monotonic()
    worker = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "qcluster"], cwd=ROOT, env=env,  # noqa: S603
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    web = subprocess.Popen([*web_command("127.0.0.1", port, workers=args.web_workers)], cwd=ROOT, env=env,  # noqa: S603
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    poller = ReadyPoller(f"{base}/ready", launched)
    poller.start()
    try:
        web_up = _wait(lambda: _answers(f"{base}/health"), timeout=900, what="gunicorn /health")
        print(f"gunicorn answered /health {web_up:.1f} s after launch; web worker RSS then: {_rss_mb(web)} MB")
        if not args.no_wait_ready:
            _wait(lambda: poller.ready_after is not None, timeout=900, what="/ready")
        puts = _item_puts(base, raw_key, str(kb.id), args.items)
        embed, chunk, total = _documents(kb, args.documents)
        _wait(lambda: poller.ready_after is not None, timeout=900, what="/ready")
        warm = requests.get(f"{base}/ready", timeout=10).json().get("warm")
        print(f"/ready first answered 200 {poller.ready_after:.1f} s after launch; "
              f"warm = {json.dumps(warm, ensure_ascii=False)}")
        print(f"RSS after the workload: web {_rss_mb(web)} MB, qcluster {_rss_mb(worker)} MB")
        mcp: tuple[float, list[float]] | None = None
        if not args.skip_mcp:
            mcp = _mcp(env, raw_key, str(kb.id), args.searches)
        print()
        print("| 测量 | 第 1 个 | 第 10 个 | 其余中位数 | 第 1 ÷ 第 10 | 全部 |")
        print("|---|---|---|---|---|---|")
        print(_row("条目 PUT，墙钟（ms）", puts, "ms"))
        print(_row("文档 embed 阶段（ms）", embed, "ms"))
        print(_row("文档 chunk 阶段（ms）", chunk, "ms"))
        print(_row("文档 202 → completed（s）", total, "s"))
        if mcp is not None:
            print(_row("MCP search_knowledge（ms）", mcp[1], "ms"))
            print(f"\nMCP: initialize answered {mcp[0]:.1f} s after `manage.py mcp` started")
    finally:
        poller.stop.set()
        # 清理任务由还活着的 worker 做完，再停进程
        task = knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)
        try:
            _wait(lambda: CleanupTask.objects.get(pk=task.pk).status == "completed", timeout=300,
                  what="knowledge base cleanup", interval=0.5)
        finally:
            stop_groups([web, worker], timeout=20)
            key.delete()


if __name__ == "__main__":
    main()
