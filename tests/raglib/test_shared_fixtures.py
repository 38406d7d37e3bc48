"""额外一层：真实的第三方样例文件（../shared/data/fixtures）的解析断言。

这些文件不随仓库分发（CI 把 shared/ 检出在仓库旁边）；不存在时整个模块以一行说明跳过。
同样的能力在 tests/raglib/test_parsing.py 里用测试时生成的中文文档覆盖，裸克隆也能全部运行。
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raglib.parsing import OcrEngine, Segment, detect_format
from tests.raglib.test_parsing import FakeOcr, assert_product_guide, parse, rapidocr, table_rows, tesseract
from tests.shared_data import FIXTURES, skip_without_shared_data

skip_without_shared_data(FIXTURES)

__all__ = ["rapidocr", "tesseract"]  # 从 test_parsing 复用的模块级夹具


@pytest.fixture(scope="module")
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture(scope="module")
def ocr_image(fixtures: Path) -> bytes:
    """样例 DOCX 里内嵌的图片（JPEG，含“横向文本框 / 竖向文本框 / English text”）。"""
    import zipfile

    with zipfile.ZipFile(fixtures / "zh" / "chatchat_ocr_test.docx") as archive:
        return archive.read("word/media/image1.jpeg")


def test_zh_docx_body_table_and_image_ocr(fixtures: Path, rapidocr: OcrEngine) -> None:
    parsed = parse(fixtures / "zh" / "chatchat_ocr_test.docx", rapidocr)
    assert parsed.format == "docx"
    assert (parsed.ocr_engine, parsed.ocr_images, parsed.ocr_skipped) == ("rapidocr", 1, False)
    assert len(parsed.segments) == 1
    text = parsed.markdown
    assert text.startswith("我是文字")
    assert "| 我是表格1 | 我是表格2 |" in table_rows(text)
    assert "| 我是表格3 | 我是表格4 |" in table_rows(text)
    # 图片中的横排、竖排中文与英文都识别出来，且放在图片原位置（表格之后）
    for expected in ("横向文本框", "竖向文本框", "English text"):
        assert expected in text
    assert text.index("横向文本框") > text.index("我是表格4")
    assert "base64" not in text


def test_zh_pdf_text_layer_and_image_ocr(fixtures: Path, rapidocr: OcrEngine) -> None:
    parsed = parse(fixtures / "zh" / "chatchat_ocr_test.pdf", rapidocr)
    assert parsed.format == "pdf"
    assert [segment.page for segment in parsed.segments] == [1]
    text = parsed.segments[0].text
    assert text.startswith("我是文字")
    for expected in ("横向文本框", "竖向文本框", "English text"):
        assert expected in text
    assert (parsed.ocr_engine, parsed.ocr_images, parsed.ocr_skipped) == ("rapidocr", 1, False)


def test_zh_pptx_text_box_table_and_picture_ocr(fixtures: Path, rapidocr: OcrEngine) -> None:
    parsed = parse(fixtures / "zh" / "chatchat_ocr_test.pptx", rapidocr)
    assert parsed.format == "pptx"
    assert [segment.slide for segment in parsed.segments] == [1]
    text = parsed.segments[0].text
    assert "我是文字" in text
    assert table_rows(text)[:2] == ["| 我是表格1 | 我是表格5 |", "| --- | --- |"]
    assert "| 我是表格3 | 我是表格4 |" in table_rows(text)
    assert "横向文本框" in text and "竖向文本框" in text
    assert parsed.ocr_images == 1 and parsed.ocr_engine == "rapidocr"


def test_tesseract_engine_on_image_and_pdf(fixtures: Path, ocr_image: bytes, tesseract: OcrEngine) -> None:
    text = tesseract.recognize(ocr_image)
    assert "横向文本框" in text and "English text" in text
    # 汉字之间不应残留 tesseract 的分词空格
    assert "横 向" not in text

    parsed = parse(fixtures / "zh" / "chatchat_ocr_test.pdf", tesseract)
    assert parsed.ocr_engine == "tesseract" and parsed.ocr_images == 1
    assert parsed.segments[0].text.startswith("我是文字")
    assert "横向文本框" in parsed.markdown


def test_without_ocr_images_are_skipped_but_text_is_kept(fixtures: Path) -> None:
    docx = parse(fixtures / "zh" / "chatchat_ocr_test.docx", None)
    assert (docx.ocr_engine, docx.ocr_images, docx.ocr_skipped) == (None, 0, True)
    assert "我是文字" in docx.markdown and "| 我是表格1 | 我是表格2 |" in docx.markdown
    assert "横向文本框" not in docx.markdown

    pdf = parse(fixtures / "zh" / "chatchat_ocr_test.pdf", None)
    assert pdf.ocr_skipped and pdf.segments == (Segment("我是文字", page=1),)

    pptx = parse(fixtures / "zh" / "chatchat_ocr_test.pptx", None)
    assert pptx.ocr_skipped and pptx.segments[0].slide == 1 and "我是表格5" in pptx.markdown

    # 纯文字文档没有图片内容，不算跳过
    assert not parse(fixtures / "en" / "markitdown_test.xlsx", None).ocr_skipped


def test_pptx_picture_text_lands_in_its_own_slide(fixtures: Path) -> None:
    fake = FakeOcr("图片里的字")
    parsed = parse(fixtures / "en" / "markitdown_test.pptx", fake)
    assert [segment.slide for segment in parsed.segments] == [1, 2, 3, 4, 5, 6]
    with_picture = [segment.slide for segment in parsed.segments if "图片里的字" in segment.text]
    assert with_picture == [2, 6]
    assert parsed.ocr_engine == "fake" and parsed.ocr_images == len(fake.images) == 2
    slides = {segment.slide: segment.text for segment in parsed.segments}
    assert slides[1].startswith("# AutoGen: Enabling Next-Gen LLM Applications")
    assert "| 7 | 8 | 9 | 1b92870d-e3b5-4e65-8153-919f4ff45592 | 11 | 12 |" in slides[3]
    assert "### Chart: a3f6004b-6f4f-4ea8-bee3-3741f4dc385f" in slides[4]
    assert "This is a nested shape with content in 2 shapes" in slides[5]


def test_en_docx_headings_and_table(fixtures: Path) -> None:
    parsed = parse(fixtures / "en" / "markitdown_test.docx", None)
    text = parsed.markdown
    assert text.startswith("AutoGen: Enabling Next-Gen LLM Applications via Multi-Agent Conversation")
    assert "# Abstract" in text.splitlines() and "# Introduction" in text.splitlines()
    assert "## d666f1f7-46cb-42bd-9a39-9a39cf2a509f" in text
    assert "| 13 | 14 | 49e168b7-d2ae-407f-a055-2167576f39a1 | 15 | 16 | 17 |" in table_rows(text)
    assert "314b0a30-5b04-470b-b9f7-eed2c2bec74a" in text
    # 文档里有一张截图：没有 OCR 引擎 → 记为跳过
    assert parsed.ocr_skipped and "base64" not in text


# pandas 提示 xlrd 引擎将来会移除：XLS 目前只能走它（markitdown 的实现），提示本身不影响结果
@pytest.mark.filterwarnings("ignore:The xlrd engine is deprecated")
@pytest.mark.parametrize("name", ["markitdown_test.xlsx", "markitdown_test.xls"])
def test_spreadsheet_one_segment_per_sheet(fixtures: Path, name: str) -> None:
    parsed = parse(fixtures / "en" / name, None)
    assert parsed.format == name.rsplit(".", 1)[1]
    assert [segment.sheet for segment in parsed.segments] == ["Sheet1", "09060124-b5e7-4717-9d07-3c046eb"]
    first, second = (segment.text for segment in parsed.segments)
    assert first.startswith("## Sheet1\n\n| Alpha | Beta | Gamma | Delta |")
    assert "| 58 | 6ff4173b-42a5-4784-9b19-f49caff4d93d | 22 | 9 |" in table_rows(first)
    assert len(table_rows(first)) == 2 + 23
    assert "| 13 | 14 | 15 | affc7dad-52dc-4b98-9b5d-51e65d8a8ad0 |" in table_rows(second)
    assert "affc7dad" not in first and "NaN" not in parsed.markdown


def test_en_pdf_text_on_page_one(fixtures: Path) -> None:
    parsed = parse(fixtures / "en" / "markitdown_test.pdf", FakeOcr())
    assert [segment.page for segment in parsed.segments] == [1]
    text = parsed.segments[0].text
    assert "Large language models (LLMs) are becoming a crucial building block" in text
    assert "multi-agent conversations" in text
    # 纯文字 PDF 不触发 OCR
    assert (parsed.ocr_engine, parsed.ocr_images, parsed.ocr_skipped) == (None, 0, False)


def test_zh_html_headings_and_table(fixtures: Path) -> None:
    parsed = parse(fixtures / "zh" / "ragflow_html.sample.zh.html", None)
    assert parsed.format == "html"
    assert_product_guide(parsed.markdown)


def test_wikipedia_html_keeps_article_and_drops_navigation(fixtures: Path) -> None:
    text = parse(fixtures / "en" / "markitdown_test_wikipedia.html", None).markdown
    assert text.startswith("# Microsoft")
    assert "## History" in text.splitlines() and "### 1972\u20131985: Founding" in text.splitlines()
    assert "**Microsoft Corporation** is an American [multinational corporation]" in text
    # 154 种语言的跳转列表、脚本都不应进入正文
    assert "Afrikaans" not in text and "function(" not in text and "RLQ=window.RLQ" not in text


def test_real_files_are_recognised_by_content(fixtures: Path) -> None:
    """真实文件的魔数与内部结构（尤其是生成不了的老式 .xls）按内容识别。"""
    for relative in ("zh/chatchat_ocr_test.docx", "zh/chatchat_ocr_test.pdf", "en/markitdown_test.pptx",
                     "en/markitdown_test.xlsx", "en/markitdown_test.xls", "zh/ragflow_html.sample.zh.html"):
        fmt = relative.rsplit(".", 1)[1]
        assert detect_format((fixtures / relative).read_bytes()[:8192], f"a.{fmt}") == fmt, relative


@pytest.mark.parametrize(("relative", "fmt", "expected"), [
    ("en/markitdown_test.epub", "epub", ["Test EPUB Document", "Test Author"]),
    ("en/markitdown_test_outlook_msg.msg", "msg", ["Test Email Message", "test.sender@example.com",
                                                   "This is the body of the test email message"]),
])
def test_epub_and_outlook_fixtures(fixtures: Path, relative: str, fmt: str, expected: list[str]) -> None:
    """EPUB 与 .msg：按内容识别，正文与元数据都在。"""
    path = fixtures / relative
    assert detect_format(path.read_bytes()[:8192], path.name) == fmt
    parsed = parse(path)
    assert parsed.format == fmt
    for text in expected:
        assert text in parsed.markdown
