"""测试数据：直接写入文档与带向量的分块，或经真实的上传与摄取流水线写入文本文档。"""

from __future__ import annotations

import json
import random
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile

from documents.models import Document, DocumentChunk
from knowledge.models import KnowledgeBase


def add_documents(kb: KnowledgeBase, *, documents: int, chunks_per_document: int, dim: int = 384) -> int:
    """为知识库写入 documents * chunks_per_document 个分块，返回写入的总行数（文档 + 分块）。"""
    rng = random.Random(42)
    docs = Document.objects.bulk_create(
        Document(knowledge_base=kb, filename=f"doc-{i}.txt", status=Document.Status.COMPLETED,
                 chunk_count=chunks_per_document)
        for i in range(documents)
    )
    DocumentChunk.objects.bulk_create(
        DocumentChunk(
            knowledge_base=kb, document=doc, chunk_index=j, chunk_text=f"第 {j} 段", embedding_dim=dim,
            embedding=[rng.uniform(-1, 1) for _ in range(dim)],
        )
        for doc in docs
        for j in range(chunks_per_document)
    )
    return documents + documents * chunks_per_document


def ingest_text(client: Any, kb: KnowledgeBase, name: str, text: str, **fields: Any) -> Document:
    """经真实的上传与摄取流水线写入一份文本文档（任务同步执行），断言摄取成功；``fields`` 按 JSON 表单字段发送。"""
    data = {"file": SimpleUploadedFile(name, text.encode()), **{k: json.dumps(v) for k, v in fields.items()}}
    response = client.post(f"/knowledge_bases/{kb.id}/documents", data, format="multipart")
    assert response.status_code == 202, response.content
    document = Document.objects.get(pk=response.json()["document_id"])
    assert document.status == Document.Status.COMPLETED, document.error_message
    return document
