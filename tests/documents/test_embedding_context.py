"""embedding 的标题上下文（RAG_EMBED_HEADING_CONTEXT）：送去模型的文本带标题路径，返回的分块文本不变，
重新索引时按带标题的输入判断能否复用旧向量。"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

from documents.models import DocumentChunk
from documents.services import document_reindex, document_upload
from infra.principal import SYSTEM_PRINCIPAL
from tests.conftest import FakeEmbedder

CLAUSES = "".join(f"第{i}条 合同签订后十日内支付百分之三十的预付款，验收合格后支付其余款项。" for i in range(1, 9))
MARKDOWN = f"# 招标文件\n\n## 付款方式\n\n{CLAUSES}\n"


class RecordingEmbedder(FakeEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        return super().embed_documents(texts)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch, fake_embedder: Any) -> RecordingEmbedder:
    from documents import ingestion

    recording = RecordingEmbedder()
    monkeypatch.setattr(ingestion, "embedder", lambda provider, model: recording)
    return recording


def _ingest(kb: Any, capture: Any) -> Any:
    with capture(execute=True):
        return document_upload(kb=kb, filename="tender.md", upload=io.BytesIO(MARKDOWN.encode()), metadata={},
                               chunking={"strategy": "token", "chunk_size": 64, "overlap": 0})


@pytest.mark.django_db
def test_heading_context_prefixes_only_the_embedding_input(
        kb_factory: Any, recorder: RecordingEmbedder, django_capture_on_commit_callbacks: Any, settings: Any) -> None:
    settings.EMBED_HEADING_CONTEXT = True
    document = _ingest(kb_factory(), django_capture_on_commit_callbacks)
    first, *rest = DocumentChunk.objects.filter(document=document).order_by("chunk_index")
    assert rest, "要有不含标题的后续分块"
    # 第一个分块从标题开始、自己带着标题，不重复；后面的分块加上标题路径。返回给调用方的文本都不带前缀
    assert recorder.texts == [first.chunk_text] + [f"招标文件 > 付款方式\n\n{c.chunk_text}" for c in rest]
    assert not any(c.chunk_text.startswith("招标文件 >") for c in rest)

    recorder.texts.clear()
    with django_capture_on_commit_callbacks(execute=True):
        document_reindex(principal=SYSTEM_PRINCIPAL, document_id=document.id)
    assert recorder.texts == []  # 输入没变：复用旧向量

    settings.EMBED_HEADING_CONTEXT = False
    with django_capture_on_commit_callbacks(execute=True):
        document_reindex(principal=SYSTEM_PRINCIPAL, document_id=document.id)
    assert recorder.texts == [c.chunk_text for c in rest]  # 只有输入变了（不再带标题）的分块重新计算


@pytest.mark.django_db
def test_heading_context_is_off_by_default(kb_factory: Any, recorder: RecordingEmbedder,
                                           django_capture_on_commit_callbacks: Any) -> None:
    document = _ingest(kb_factory(), django_capture_on_commit_callbacks)
    chunks = DocumentChunk.objects.filter(document=document).order_by("chunk_index")
    assert recorder.texts == [c.chunk_text for c in chunks]
