"""整库清理的耗时：逐批删分块、触发器逐个记进删除集，与先整段删掉全文的段和统计行（``search.segments.drop``）并排。

    .venv/bin/python bench/cleanup_scale.py                   # 源库默认是 fulltext_scale.py --grow 留下的 1 万分块库
    .venv/bin/python bench/cleanup_scale.py --source NAME

把源库复制两份（各自按分块建全文索引），一份不先删全文数据、逐批删分块（统计行在，触发器把每个分块记进删除集），
一份按现在的清理顺序：``segments.drop`` 之后逐批删分块；批大小取 ``RAG_CLEANUP_BATCH_SIZE``，都用
``ops.cleanup.delete_batch``（与清理任务同一个函数）。最后核对两份都没有留下全文数据。
"""

from __future__ import annotations

import argparse
import time

from django_setup import setup_django

setup_django()

from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from bench.fulltext_scale import _copy_rows, _kb, _without_triggers  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from ops.cleanup import delete_batch  # noqa: E402
from search import segments  # noqa: E402


def _delete_all(kb: KnowledgeBase) -> int:
    batches = 0
    while True:
        with transaction.atomic():
            if not delete_batch(kb.id, settings.CLEANUP_BATCH_SIZE):
                return batches
        batches += 1


def _leftovers(kb: KnowledgeBase) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT (SELECT count(*) FROM fulltext_kb_stats WHERE knowledge_base_id = %s)"
                       " + (SELECT count(*) FROM fulltext_l0 WHERE knowledge_base_id = %s)"
                       " + (SELECT count(*) FROM fulltext_docs WHERE knowledge_base_id = %s)"
                       " + (SELECT count(*) FROM fulltext_deleted WHERE knowledge_base_id = %s)"
                       " + (SELECT count(*) FROM fulltext_segments WHERE knowledge_base_id = %s)",
                       [kb.id] * 5)
        return int(cursor.fetchone()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="bench-fulltext-10k")
    args = parser.parse_args()
    source = KnowledgeBase.objects.get(name=args.source)
    copies = {}
    for number, name in enumerate(("in-place", "drop-first"), start=1):
        kb = copies[name] = _kb(f"bench-cleanup-{name}")
        with _without_triggers() as cursor:
            _copy_rows(cursor, source, kb, 200 + number, documents="TRUE", vectors=False)
        segments.rebuild(kb.id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM document_chunks WHERE knowledge_base_id = %s", [copies["in-place"].id])
        chunks = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM fulltext_segments WHERE knowledge_base_id = %s", [copies["in-place"].id])
        parts = cursor.fetchone()[0]
    print(f"每份 {chunks:,} 个分块、{parts} 个段，批大小 {settings.CLEANUP_BATCH_SIZE}", flush=True)
    for name, kb in copies.items():
        started = time.perf_counter()
        dropped = segments.drop(kb.id) if name == "drop-first" else 0
        first = time.perf_counter() - started
        batches = _delete_all(kb)
        segments.drop(kb.id)
        seconds = time.perf_counter() - started
        print(f"  {name:<11} {seconds:7.1f} s（先删段 {dropped} 个 {first:.1f} s，再删分块 {batches} 批），"
              f"剩余全文行 {_leftovers(kb)}", flush=True)
        kb.delete()


if __name__ == "__main__":
    main()
