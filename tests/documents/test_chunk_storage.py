"""向量列留在行内（迁移 documents.0008）：长正文与 tsvector 先被挪进 TOAST，384 维向量不挪。

精确扫描与重排逐行读向量；向量被挪进 TOAST 时每行多一次 TOAST 索引查找与页读取（bench/vector_storage.py：
1 万分块的精确扫描缓冲页 41,270 → 2,510）。
"""

from __future__ import annotations

import numpy as np
import pytest
from django.db import connection

from documents.models import Document, DocumentChunk

pytestmark = pytest.mark.django_db


def test_embedding_column_prefers_inline_storage() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT attstorage FROM pg_attribute WHERE attrelid = 'document_chunks'::regclass"
                       " AND attname = 'embedding'")
        assert cursor.fetchone()[0] == "m"


def test_long_chunk_keeps_its_vector_in_the_row(kb_factory) -> None:
    kb = kb_factory(name="inline", embedding_dimension=384)
    document = Document.objects.create(knowledge_base=kb, filename="long.txt", status=Document.Status.COMPLETED)
    rng = np.random.default_rng(0)
    vector = rng.normal(size=384).astype(np.float32)
    chunk = DocumentChunk.objects.create(
        knowledge_base=kb, document=document, chunk_index=0, role="chunk", token_count=1, text_hash="",
        # 约 1.2 KB 压不动的正文 + 1.5 KB 向量：整行超过 2 KB，必须挪出一列；默认存储时挪走的是向量
        chunk_text="".join(chr(0x4E00 + int(i)) for i in rng.integers(0, 20000, size=400)),
        embedding=(vector / np.linalg.norm(vector)).tolist(), embedding_dim=384,
    )
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version_num")
        if int(cursor.fetchone()[0]) < 170000:
            pytest.skip("pg_column_toast_chunk_id() needs PostgreSQL 17+")
        cursor.execute("SELECT pg_column_toast_chunk_id(embedding) IS NULL,"
                       " pg_column_toast_chunk_id(chunk_text) IS NOT NULL FROM document_chunks WHERE id = %s",
                       [chunk.id])
        assert cursor.fetchone() == (True, True)
