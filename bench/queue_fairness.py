"""队列公平：主队列被一个长摄取占满时，小文件上传与知识库清理要等多久。

用法（项目根目录）：
    .venv/bin/python bench/queue_fairness.py [--rounds 3]

在当前配置的数据库里（默认内嵌 PostgreSQL，先自动迁移）起一个真实的 ``manage.py qcluster``（主队列 1 个
worker + 快队列 1 个 worker），上传一个长文档（走主队列，embed 要几分钟）并等它进入 embed 阶段；随后每轮
上传一个小文件、删除一个带 20 个分块的知识库，记录从 202 到 completed 的时间。最后删除长文档的知识库、
停止集群。不需要 ../shared 数据。
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")
os.environ["RAG_QUEUE_SYNC"] = "false"
os.environ.setdefault("RAG_LOG_LEVEL", "warning")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from documents.models import Document  # noqa: E402
from documents.services import document_upload  # noqa: E402
from infra.principal import SYSTEM_PRINCIPAL  # noqa: E402
from knowledge.models import CleanupTask  # noqa: E402
from knowledge.services import knowledge_base_create, knowledge_base_delete  # noqa: E402
from ops.management.commands.serve import stop_groups  # noqa: E402

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
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
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


if __name__ == "__main__":
    main()
