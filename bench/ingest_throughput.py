"""摄取吞吐基准：把 cmrc2018 的整篇文档经真实上传/摄取路径写入一个新知识库，报告各阶段 chunks/s。

用法（项目根目录）：
    .venv/bin/python bench/ingest_throughput.py [--limit N] [--strategy token|semantic|recursive|parent_child]

数据读自 ../shared/data/cmrc2018/documents.jsonl（不随仓库分发）。基准在当前配置的数据库里新建知识库，
结束后经正常的删除与清理路径移除。任务在本进程内同步执行，因此各阶段耗时不含排队时间。
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

import django  # noqa: E402

django.setup()

from documents.models import Document  # noqa: E402
from documents.services import document_upload  # noqa: E402
from infra.principal import SYSTEM_PRINCIPAL  # noqa: E402
from knowledge.services import knowledge_base_create, knowledge_base_delete  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "cmrc2018" / "documents.jsonl"
STAGES = ("parse", "chunk", "embed", "store")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=200, help="文档数（默认 200，全部为 1104）")
    parser.add_argument("--strategy", default="token", choices=["token", "semantic", "recursive", "parent_child"])
    args = parser.parse_args()

    rows = [json.loads(line) for line in DATA.open(encoding="utf-8")][: args.limit]
    kb = knowledge_base_create(principal=SYSTEM_PRINCIPAL, name=f"bench-ingest-{int(time.time())}",
                               chunking={"strategy": args.strategy})
    started = time.perf_counter()
    try:
        for row in rows:
            body = f"# {row['title']}\n\n{row['text']}".encode()
            document_upload(kb=kb, filename=f"{row['doc_id']}.md", upload=io.BytesIO(body),
                            metadata={"title": row["title"]}, chunking={})
        wall = time.perf_counter() - started
        documents = list(Document.objects.filter(knowledge_base=kb))
        failed = [d for d in documents if d.status != "completed"]
        chunks = sum(d.chunk_count for d in documents)
        chars = sum(len(r["text"]) for r in rows)
        totals = {stage: sum(d.stage_timings.get(f"{stage}_ms", 0.0) for d in documents) / 1000 for stage in STAGES}
        print(f"策略 {args.strategy}，文档 {len(rows)}（失败 {len(failed)}），分块 {chunks}，"
              f"正文 {chars} 字符，embedding {kb.embedding_provider}:{kb.embedding_model}")
        print("| 阶段 | 总耗时 (s) | chunks/s | 占比 |\n|---|---|---|---|")
        busy = sum(totals.values())
        for stage in STAGES:
            rate = chunks / totals[stage] if totals[stage] else float("inf")
            print(f"| {stage} | {totals[stage]:.2f} | {rate:,.0f} | {totals[stage] / busy:.0%} |")
        print(f"| 端到端（含上传与排队之外的全部开销） | {wall:.2f} | {chunks / wall:,.1f} | |")
    finally:
        knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)


if __name__ == "__main__":
    main()
