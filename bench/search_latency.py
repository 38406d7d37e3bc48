"""检索延迟基准：cmrc2018 段落经真实摄取写入知识库后，用 cmrc2018 的问题经 POST /search 检索，
报告各检索方式的 p50/p95 与分阶段耗时（取自响应的 Server-Timing 头）。

用法（项目根目录）：
    .venv/bin/python bench/search_latency.py [--passages 200] [--queries 300] [--keep]
    .venv/bin/python bench/search_latency.py --kb bench-search-XXXX   # 复用上次 --keep 留下的知识库

请求经 Django 测试客户端走完整的 URL 路由、鉴权、DRF 序列化与中间件，只是不经 TCP/gunicorn。
每种方式先用前 20 个问题预热（模型加载、连接建立），再计时；查询向量缓存在每种方式开始前清空，
所以 embed 阶段是真实的模型耗时。
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")
os.environ.setdefault("RAG_QUEUE_SYNC", "true")
os.environ.setdefault("RAG_LOG_LEVEL", "warning")
os.environ.setdefault("RAG_AUTH_ENABLED", "false")
os.environ.setdefault("RAG_RERANK_PROVIDER", "none")

import django  # noqa: E402

django.setup()

import numpy as np  # noqa: E402
from django.test import Client  # noqa: E402

from bench.e2e_report import parse_server_timing  # noqa: E402
from documents.services import document_upload  # noqa: E402
from infra.principal import SYSTEM_PRINCIPAL  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from knowledge.services import knowledge_base_create, knowledge_base_delete  # noqa: E402
from search.query_embeddings import clear_query_embeddings  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "cmrc2018"
STAGES = ("embed", "vector", "fulltext", "fuse", "rerank", "total")
WARMUP = 20


def _jsonl(name: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in (DATA / name).open(encoding="utf-8") if line.strip()]


def _ingest(passages: int) -> KnowledgeBase:
    rows = sorted(_jsonl("corpus.jsonl"), key=lambda r: str(r["_id"]))[:passages]
    kb = knowledge_base_create(principal=SYSTEM_PRINCIPAL, name=f"bench-search-{int(time.time())}")
    started = time.perf_counter()
    for index, row in enumerate(rows, start=1):
        document_upload(kb=kb, filename=f"{row['_id']}.txt", upload=io.BytesIO(str(row["text"]).encode()),
                        metadata={"title": row["title"]}, chunking={})
        print(f"\r摄取 {index}/{len(rows)}", end="", file=sys.stderr)
    print(f"\n摄取 {len(rows)} 段用时 {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return kb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=200, help="摄取的段落数（按 id 取前 N 段）")
    parser.add_argument("--queries", type=int, default=300, help="计时的问题数（这些段落的问题，按 id）")
    parser.add_argument("--kb", help="复用已有知识库（名称），跳过摄取")
    parser.add_argument("--keep", action="store_true", help="结束后保留知识库")
    parser.add_argument("--modes", default="hybrid,vector,fulltext")
    args = parser.parse_args()

    kb = KnowledgeBase.objects.get(name=args.kb) if args.kb else _ingest(args.passages)
    titles = set(kb.documents.values_list("filename", flat=True))
    queries = [q for q in _jsonl("queries.jsonl")
               if f"{q['metadata']['passage_id']}.txt" in titles][:args.queries + WARMUP]  # type: ignore[index]
    client = Client()
    print(f"知识库 {kb.name}：{len(titles)} 段，{kb.chunks.count()} 个分块；计时问题 {len(queries) - WARMUP} 个")
    print("| 方式 | p50 (ms) | p95 (ms) | " + " | ".join(f"{s} p50/p95" for s in STAGES[:-1]) + " |")
    print("|---|---|---|" + "---|" * (len(STAGES) - 1))
    try:
        for mode in args.modes.split(","):
            clear_query_embeddings()
            stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
            wall: list[float] = []
            for index, query in enumerate(queries):
                started = time.perf_counter()
                response = client.post("/search", {"query": query["text"], "knowledge_base_id": str(kb.id),
                                                   "mode": mode, "top_k": 5}, content_type="application/json")
                elapsed = (time.perf_counter() - started) * 1000
                assert response.status_code == 200, response.content
                if index < WARMUP:
                    continue
                wall.append(elapsed)
                timing = parse_server_timing(response["Server-Timing"])
                for stage in STAGES:
                    if stage in timing:
                        stages[stage].append(timing[stage])

            def pct(values: list[float]) -> str:
                if not values:
                    return "-"
                return f"{np.percentile(values, 50):.1f} / {np.percentile(values, 95):.1f}"

            print(f"| {mode} | {np.percentile(wall, 50):.1f} | {np.percentile(wall, 95):.1f} | "
                  + " | ".join(pct(stages[s]) for s in STAGES[:-1]) + " |")
    finally:
        if not args.keep and not args.kb:
            knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)


if __name__ == "__main__":
    main()
