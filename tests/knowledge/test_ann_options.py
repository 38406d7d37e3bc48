"""知识库的向量索引压缩选项：经 API 创建、修改与读出；非法值按统一错误格式拒绝。"""

from __future__ import annotations

import pytest

from knowledge.models import KnowledgeBase
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db


def test_vector_compression_defaults_to_halfvec_and_can_be_chosen(client_rw):
    plain = client_rw.post("/knowledge_bases", {"name": "plain"}, format="json").json()
    assert plain["vector_compression"] == "halfvec"
    response = client_rw.post("/knowledge_bases", {"name": "compact", "vector_compression": "binary"}, format="json")
    assert response.status_code == 201
    assert response.json()["vector_compression"] == "binary"
    assert KnowledgeBase.objects.get(pk=response.json()["id"]).vector_compression == "binary"


def test_vector_compression_can_be_changed_later(client_rw, kb_factory):
    kb = kb_factory(name="switch")
    response = client_rw.patch(f"/knowledge_bases/{kb.id}", {"vector_compression": "none"}, format="json")
    assert response.status_code == 200
    assert response.json()["vector_compression"] == "none"
    kb.refresh_from_db()
    assert kb.vector_compression == "none"


def test_unknown_vector_compression_is_rejected(client_rw):
    response = client_rw.post("/knowledge_bases", {"name": "bad", "vector_compression": "pq"}, format="json")
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert error["details"][0]["field"] == "vector_compression"
