"""知识库的向量索引压缩选项：经 API 创建、修改与读出；非法值按统一错误格式拒绝。"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from knowledge.models import KnowledgeBase
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db


def test_vector_compression_defaults_to_float32_and_can_be_chosen(client_rw):
    plain = client_rw.post("/knowledge_bases", {"name": "plain"}, format="json").json()
    assert plain["vector_compression"] == "none"  # 默认模型 384 维
    response = client_rw.post("/knowledge_bases", {"name": "compact", "vector_compression": "binary"}, format="json")
    assert response.status_code == 201
    assert response.json()["vector_compression"] == "binary"
    assert KnowledgeBase.objects.get(pk=response.json()["id"]).vector_compression == "binary"


def test_vector_compression_can_be_changed_later(client_rw, kb_factory):
    kb = kb_factory(name="switch")
    response = client_rw.patch(f"/knowledge_bases/{kb.id}", {"vector_compression": "halfvec"}, format="json")
    assert response.status_code == 200
    assert response.json()["vector_compression"] == "halfvec"
    kb.refresh_from_db()
    assert kb.vector_compression == "halfvec"


def test_unknown_vector_compression_is_rejected(client_rw):
    response = client_rw.post("/knowledge_bases", {"name": "bad", "vector_compression": "pq"}, format="json")
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert error["details"][0]["field"] == "vector_compression"


@pytest.mark.parametrize(("dimension", "expected"), [(384, "none"), (768, "halfvec"), (1024, "halfvec")])
def test_default_compression_follows_the_model_dimension(client_rw, monkeypatch, dimension, expected):
    """不指定时按维度选：≥ 768 维的模型（BGE-M3 是 1024 维）默认 halfvec，384 维的小模型默认 float32。"""
    from search import embedders

    monkeypatch.setattr(embedders, "embedder", lambda provider, model: SimpleNamespace(dimension=dimension))
    response = client_rw.post("/knowledge_bases", {"name": f"dim-{dimension}"}, format="json")
    assert response.status_code == 201
    assert response.json()["vector_compression"] == expected
