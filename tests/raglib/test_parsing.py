"""文档解析层测试：测试时生成的中文样例（见 sample_docs.py）的内容断言、OCR 引擎、编码、格式识别与错误。

- 断言的是“解析出了什么”（正文、表格、OCR 文字、页码/工作表/幻灯片位置），不只是“没报错”；
- 两个 OCR 引擎各自单独测（未安装则跳过），引擎按模块复用，避免重复加载模型；
- 不需要数据库，也不需要仓库外的文件；真实第三方样例（../shared/data）的测试在 tests/raglib/test_shared_fixtures.py。
"""

from __future__ import annotations

import hashlib
import io
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from raglib.chunking import ChunkingOptions, Tokenizer, chunk_text
from raglib.parsing import (
    SUPPORTED_EXTENSIONS,
    OcrEngine,
    ParsedDocument,
    ParseError,
    RapidOcrEngine,
    Segment,
    TesseractEngine,
    UnsupportedFormatError,
    detect_format,
    get_ocr_engine,
    ocr_available,
    parse_document,
)
from raglib.parsing import ocr as ocr_module
from raglib.parsing.delimited import MAX_COLUMNS, MAX_FIELD_CHARS, sniff_delimiter
from raglib.parsing.limits import LimitExceeded, ParseLimits
from raglib.parsing.text import decode_text
from tests import sample_docs
from tests.sample_docs import BODY, PICTURE_LINES, SCAN_LINES

ZH_SAMPLE = "中文测试，招标文件第一章 总则"
ZH_SAMPLE_TRADITIONAL = "中文測試，招標文件第一章 總則"


# ---------------------------------------------------------------- 夹具与工具


@pytest.fixture(scope="module")
def rapidocr() -> OcrEngine:
    if not RapidOcrEngine.available():
        pytest.skip("rapidocr (with its models) is not installed")
    engine = get_ocr_engine("rapidocr")
    assert engine is not None
    return engine


@pytest.fixture(scope="module")
def tesseract() -> OcrEngine:
    if not TesseractEngine.available():
        pytest.skip("tesseract with chi_sim is not installed (apt: tesseract-ocr tesseract-ocr-chi-sim)")
    engine = get_ocr_engine("tesseract")
    assert engine is not None
    return engine


class FakeOcr:
    """假的 OCR 引擎：记录每次收到的图片，返回固定文字。用来测“哪些图被送去识别、文字放在哪”。"""

    name = "fake"

    def __init__(self, text: str = "假图片文字") -> None:
        self.text = text
        self.images: list[bytes] = []

    def recognize(self, image: bytes) -> str:
        self.images.append(image)
        return self.text


class BrokenOcr:
    """每次识别都抛异常的引擎（模拟 onnxruntime 崩溃）。"""

    name = "broken"

    def recognize(self, image: bytes) -> str:
        raise RuntimeError("engine crashed")


@pytest.fixture(scope="module")
def ocr_image() -> bytes:
    """带中英文三行字（PICTURE_LINES）的 JPEG，用 CJK 字体渲染。"""
    return sample_docs.text_picture(fmt="JPEG")


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """生成的中文样例文档，写成文件（解析器读的是路径）。"""
    folder = tmp_path_factory.mktemp("samples")
    for name, data in (("zh.docx", sample_docs.zh_docx()), ("zh.pptx", sample_docs.zh_pptx()),
                       ("zh.xlsx", sample_docs.zh_xlsx()), ("zh.pdf", sample_docs.zh_pdf()),
                       ("zh.html", sample_docs.ZH_HTML.encode()), ("zh.epub", sample_docs.zh_epub())):
        (folder / name).write_bytes(data)
    return folder


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def parse(path: Path, ocr: OcrEngine | None = None, filename: str | None = None) -> ParsedDocument:
    return parse_document(path, filename=filename or path.name, ocr=ocr)


def png_bytes(size: tuple[int, int], color: str = "white", draw: Callable[..., None] | None = None) -> bytes:
    from PIL import Image, ImageDraw

    picture = Image.new("RGB", size, color)
    if draw is not None:
        draw(ImageDraw.Draw(picture))
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


# ---------------------------------------------------------------- 手写 PDF（可选加密：标准安全处理器 R2 / RC4-40）

_PDF_PAD = bytes.fromhex("28BF4E5E4E758A4164004E56FFFA01082E2E00B6D0683E802F0CA9FE6453697A")


def _rc4(key: bytes, data: bytes) -> bytes:
    state = list(range(256))
    j = 0
    for i in range(256):
        j = (j + state[i] + key[i % len(key)]) % 256
        state[i], state[j] = state[j], state[i]
    out = bytearray()
    i = j = 0
    for byte in data:
        i = (i + 1) % 256
        j = (j + state[i]) % 256
        state[i], state[j] = state[j], state[i]
        out.append(byte ^ state[(state[i] + state[j]) % 256])
    return bytes(out)


def make_pdf(page_texts: list[str], *, user: str | None = None, owner: str = "owner") -> bytes:
    """手写一个带文字层的 PDF（每个字符串一页，空串是空白页）。

    给了 ``user`` 就按 PDF 规范（标准安全处理器 R2，算法 3.1-3.4，RC4-40）真正加密：
    user 非空表示需要打开密码，空串表示只有权限密码。
    """

    def padded(password: str) -> bytes:
        return (password.encode("latin-1") + _PDF_PAD)[:32]

    perms = -44
    file_id = b"ragservice-test!"
    key = b""
    encrypt_entries = b""
    if user is not None:
        o_entry = _rc4(hashlib.md5(padded(owner)).digest()[:5], padded(user))
        key = hashlib.md5(padded(user) + o_entry + struct.pack("<i", perms) + file_id).digest()[:5]
        u_entry = _rc4(key, _PDF_PAD)
        encrypt_entries = b"<< /Filter /Standard /V 1 /R 2 /O <%s> /U <%s> /P %d >>" % (
            o_entry.hex().encode(), u_entry.hex().encode(), perms)

    def stream(number: int, text: str) -> bytes:
        data = f"BT /F1 14 Tf 72 700 Td ({text}) Tj ET".encode("latin-1") if text else b""
        if key:
            data = _rc4(hashlib.md5(key + number.to_bytes(3, "little") + b"\0\0").digest()[:10], data)
        return b"<< /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"

    font_number = 3 + 2 * len(page_texts)
    kids = b" ".join(b"%d 0 R" % (3 + 2 * index) for index in range(len(page_texts)))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, len(page_texts))]
    for index, text in enumerate(page_texts):
        page_number = 3 + 2 * index
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R"
                       b" /Resources << /Font << /F1 %d 0 R >> >> >>" % (page_number + 1, font_number))
        objects.append(stream(page_number + 1, text))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    trailer_extra = b""
    if encrypt_entries:
        objects.append(encrypt_entries)
        trailer_extra = b" /Encrypt %d 0 R /ID [<%s> <%s>]" % (len(objects), file_id.hex().encode(),
                                                               file_id.hex().encode())
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R%s >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, trailer_extra, xref)
    return bytes(out)


def fake_ole(*stream_names: str) -> bytes:
    """只含文件头与目录项名字的 OLE 复合文件片段（格式判定只看魔数与 UTF-16LE 流名）。"""
    header = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 504
    directory = b"".join(name.encode("utf-16-le").ljust(128, b"\0") for name in ("Root Entry", *stream_names))
    return header + directory + b"\0" * 1024


# ---------------------------------------------------------------- 公共类型


def test_supported_extensions_and_markdown_join() -> None:
    assert SUPPORTED_EXTENSIONS == (".pdf", ".docx", ".xlsx", ".xls", ".csv", ".pptx", ".txt", ".md", ".markdown",
                                    ".html", ".htm", ".png", ".jpg", ".jpeg", ".epub", ".msg")
    parsed = ParsedDocument(segments=(Segment("第一页", page=1), Segment("第二页", page=2)), format="pdf",
                            ocr_engine=None, ocr_images=0, ocr_skipped=False)
    assert parsed.markdown == "第一页\n\n第二页"
    with pytest.raises(AttributeError):
        parsed.segments[0].text = "x"  # type: ignore[misc]
    error = ParseError("boom", permanent=False)
    assert error.permanent is False and ParseError("x").permanent is True


# ---------------------------------------------------------------- 中文样例 + rapidocr


def test_zh_docx_heading_body_table_and_image_ocr(samples: Path, rapidocr: OcrEngine) -> None:
    parsed = parse(samples / "zh.docx", rapidocr)
    assert parsed.format == "docx"
    assert (parsed.ocr_engine, parsed.ocr_images, parsed.ocr_skipped) == ("rapidocr", 1, False)
    assert len(parsed.segments) == 1
    text = parsed.markdown
    assert text.startswith(f"# 第一章 总则\n\n{BODY}")
    assert {"| 我是表格1 | 我是表格2 |", "| 我是表格3 | 我是表格4 |"} <= set(table_rows(text))
    # 图片里的中文与英文都识别出来，且放在图片原位置（表格之后）
    for expected in PICTURE_LINES:
        assert expected in text
    assert text.index("横向文本框") > text.index("我是表格4")
    assert "base64" not in text


def test_zh_pdf_text_layer_image_and_scanned_page(samples: Path, rapidocr: OcrEngine) -> None:
    parsed = parse(samples / "zh.pdf", rapidocr)
    assert parsed.format == "pdf"
    assert [segment.page for segment in parsed.segments] == [1, 2]
    first, scanned = (segment.text for segment in parsed.segments)
    # 第 1 页：文字层在前，内嵌图片的 OCR 文字在后
    assert first.startswith(BODY) and "投标人应当具备承担招标项目的能力。" in first
    assert first.index("English text") > first.index(BODY)
    assert all(line in first for line in PICTURE_LINES)
    # 第 2 页没有文字层：整页渲染后识别
    assert scanned.splitlines() == list(SCAN_LINES)
    assert (parsed.ocr_engine, parsed.ocr_images, parsed.ocr_skipped) == ("rapidocr", 2, False)


def test_zh_pptx_text_box_table_and_picture_ocr(samples: Path, rapidocr: OcrEngine) -> None:
    parsed = parse(samples / "zh.pptx", rapidocr)
    assert parsed.format == "pptx"
    assert [segment.slide for segment in parsed.segments] == [1, 2]
    first, second = (segment.text for segment in parsed.segments)
    assert first.startswith(BODY)
    assert table_rows(first) == ["| 我是表格1 | 我是表格2 |", "| --- | --- |", "| 我是表格3 | 我是表格4 |"]
    assert all(line in first for line in PICTURE_LINES)
    assert second == "第二张幻灯片：评分办法"
    assert parsed.ocr_images == 1 and parsed.ocr_engine == "rapidocr"


def test_image_files_png_and_jpg(tmp_path: Path, ocr_image: bytes, rapidocr: OcrEngine) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.open(io.BytesIO(ocr_image)).save(buffer, format="PNG")
    png = write(tmp_path, "扫描件.png", buffer.getvalue())
    parsed = parse(png, rapidocr)
    assert parsed.format == "png" and parsed.ocr_images == 1
    assert parsed.segments[0].text.splitlines() == list(PICTURE_LINES)

    jpg = parse(write(tmp_path, "photo.jpeg", ocr_image), rapidocr)
    assert jpg.format == "jpg" and "横向文本框" in jpg.markdown
    # 扩展名写成 .jpg、内容其实是 PNG：按内容认作 png
    swapped = parse(write(tmp_path, "really-png.jpg", buffer.getvalue()), rapidocr)
    assert swapped.format == "png"


def test_scanned_pdf_page_is_rendered_and_ocred(tmp_path: Path, ocr_image: bytes, rapidocr: OcrEngine) -> None:
    """没有文字层的 PDF（图片直接存成 PDF）：整页渲染后 OCR。"""
    from PIL import Image

    scanned = tmp_path / "scan.pdf"
    Image.open(io.BytesIO(ocr_image)).save(scanned, format="PDF", resolution=100)
    parsed = parse(scanned, rapidocr)
    assert [segment.page for segment in parsed.segments] == [1]
    assert "横向文本框" in parsed.markdown and "English text" in parsed.markdown
    assert parsed.ocr_images == 1 and not parsed.ocr_skipped

    with pytest.raises(ParseError, match="no OCR engine is available") as excinfo:
        parse(scanned, None)
    assert excinfo.value.permanent


# ---------------------------------------------------------------- tesseract


def test_tesseract_engine_on_image_and_pdf(samples: Path, ocr_image: bytes, tesseract: OcrEngine) -> None:
    text = tesseract.recognize(ocr_image)
    assert "横向文本框" in text and "English text" in text
    # 汉字之间不应残留 tesseract 的分词空格
    assert "横 向" not in text

    parsed = parse(samples / "zh.pdf", tesseract)
    assert parsed.ocr_engine == "tesseract" and parsed.ocr_images == 2
    assert parsed.segments[0].text.startswith(BODY)
    assert "图片里的中文" in parsed.segments[0].text and "投标人资格要求" in parsed.segments[1].text


# ---------------------------------------------------------------- 没有 OCR 引擎 / 假引擎


def test_without_ocr_images_are_skipped_but_text_is_kept(samples: Path) -> None:
    docx = parse(samples / "zh.docx", None)
    assert (docx.ocr_engine, docx.ocr_images, docx.ocr_skipped) == (None, 0, True)
    assert BODY in docx.markdown and "| 我是表格1 | 我是表格2 |" in docx.markdown
    assert "横向文本框" not in docx.markdown

    # 只有扫描图的第 2 页没有任何文字可留
    pdf = parse(samples / "zh.pdf", None)
    assert pdf.ocr_skipped and [segment.page for segment in pdf.segments] == [1]
    assert pdf.segments[0].text.startswith(BODY) and "横向文本框" not in pdf.markdown

    pptx = parse(samples / "zh.pptx", None)
    assert pptx.ocr_skipped and [segment.slide for segment in pptx.segments] == [1, 2]
    assert "我是表格4" in pptx.markdown

    # 纯文字文档没有图片内容，不算跳过
    assert not parse(samples / "zh.xlsx", None).ocr_skipped


def test_pptx_picture_text_lands_in_its_own_slide(samples: Path) -> None:
    fake = FakeOcr("图片里的字")
    parsed = parse(samples / "zh.pptx", fake)
    assert [segment.slide for segment in parsed.segments if "图片里的字" in segment.text] == [1]
    assert parsed.ocr_engine == "fake" and parsed.ocr_images == len(fake.images) == 1


def claimed_png(width: int, height: int) -> bytes:
    """文件头声称 ``width``x``height`` 的 PNG：只有几十字节，像素数据是残缺的（不会、也不该被解码）。"""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def pptx_with_claimed_picture(width: int, height: int) -> bytes:
    """两张幻灯片：第 1 张只有文字，第 2 张有文字和一张文件头声称 ``width``x``height`` 的图片。

    先用正常的小图生成，再把包里的图片部件换成 ``claimed_png``：python-pptx 插图时会用 Pillow 读尺寸，
    Pillow 自己的解压炸弹检查会拒绝声称 9 亿像素的图。
    """
    from pptx import Presentation
    from pptx.util import Cm

    presentation = Presentation()
    blank = presentation.slide_layouts[6]
    first = presentation.slides.add_slide(blank)
    first.shapes.add_textbox(Cm(1), Cm(1), Cm(10), Cm(2)).text_frame.text = BODY
    second = presentation.slides.add_slide(blank)
    second.shapes.add_textbox(Cm(1), Cm(1), Cm(10), Cm(2)).text_frame.text = "第二张幻灯片：评分办法"
    second.shapes.add_picture(io.BytesIO(png_bytes((64, 64), "black")), Cm(1), Cm(4), width=Cm(10))
    buffer = io.BytesIO()
    presentation.save(buffer)
    rewritten = io.BytesIO()
    with zipfile.ZipFile(buffer) as source, zipfile.ZipFile(rewritten, "w", zipfile.ZIP_DEFLATED) as target:
        for member in source.infolist():
            data = source.read(member)
            if member.filename.startswith("ppt/media/"):
                data = claimed_png(width, height)
            target.writestr(member, data)
    return rewritten.getvalue()


def test_oversized_pptx_picture_is_skipped_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """9 亿像素的内嵌图片不解码、不送 OCR，文字照常返回；说明写明哪张图（第几张幻灯片）、多少像素、上限多少。"""
    from PIL import Image

    # 与解析子进程（documents.sandbox）相同：像素上限由 ParseLimits 按文件头检查，Pillow 自己的检查关掉
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    fake = FakeOcr()
    parsed = parse(write(tmp_path, "deck.pptx", pptx_with_claimed_picture(30000, 30000)), fake)
    assert fake.images == []
    assert BODY in parsed.markdown and "评分办法" in parsed.markdown
    assert [segment.slide for segment in parsed.segments] == [1, 2]
    assert len(parsed.notes) == 1
    note = parsed.notes[0]
    for phrase in ("pptx picture 1 on slide 2 ('Picture 2')", "30000x30000 = 900 M pixels", "limit of 50 M pixels",
                   "RAG_INGEST_MAX_IMAGE_PIXELS", "skipped"):
        assert phrase in note, note
    # 没有超限的图片就没有说明
    assert parse(write(tmp_path, "ok.pptx", pptx_with_claimed_picture(640, 480)), fake).notes == ()


def test_image_file_without_ocr_is_a_permanent_error(tmp_path: Path, ocr_image: bytes) -> None:
    with pytest.raises(ParseError, match="no OCR engine is available") as excinfo:
        parse(write(tmp_path, "a.jpg", ocr_image), None)
    assert excinfo.value.permanent


def test_small_and_blank_images_are_not_ocred(tmp_path: Path) -> None:
    fake = FakeOcr()
    for name, data in (("icon.png", png_bytes((20, 200))), ("blank.png", png_bytes((400, 300), "#eeeeee"))):
        with pytest.raises(ParseError, match="OCR found no text"):
            parse(write(tmp_path, name, data), fake)
    assert fake.images == []
    # 有内容的图照常识别
    text_like = png_bytes((300, 100), draw=lambda canvas: canvas.rectangle((20, 30, 280, 60), fill="black"))
    assert parse(write(tmp_path, "ok.png", text_like), fake).markdown == "假图片文字"
    assert len(fake.images) == 1


def test_ocr_engine_failure_degrades_gracefully(samples: Path, tmp_path: Path, ocr_image: bytes) -> None:
    parsed = parse(samples / "zh.docx", BrokenOcr())
    assert BODY in parsed.markdown and parsed.ocr_images == 0
    with pytest.raises(ParseError, match="OCR failed") as excinfo:
        parse(write(tmp_path, "a.jpg", ocr_image), BrokenOcr())
    assert excinfo.value.permanent is False


def test_pdf_pages_are_numbered_and_blank_pages_dropped(tmp_path: Path) -> None:
    fake = FakeOcr()
    parsed = parse(write(tmp_path, "three.pdf", make_pdf(["Chapter one text", "", "Chapter three text"])), fake)
    assert parsed.segments == (Segment("Chapter one text", page=1), Segment("Chapter three text", page=3))
    # 空白页渲染出来是纯色，不送去识别，也不算“跳过了图片”
    assert fake.images == [] and not parsed.ocr_skipped


def test_blank_scan_has_no_text(tmp_path: Path) -> None:
    from PIL import Image

    scanned = tmp_path / "blank-scan.pdf"
    Image.new("RGB", (850, 1100), "white").save(scanned, format="PDF", resolution=100)
    fake = FakeOcr()
    with pytest.raises(ParseError, match="No text could be extracted"):
        parse(scanned, fake)
    assert fake.images == []


def test_xlsx_embedded_image_and_empty_sheet(tmp_path: Path, ocr_image: bytes) -> None:
    import openpyxl
    from openpyxl.drawing.image import Image as SheetImage

    workbook = openpyxl.Workbook()
    prices = workbook.active
    prices.title = "报价"
    prices.append(["项目", "金额"])
    prices.append(["设备", 100])
    prices.append([None, 5])
    figures = workbook.create_sheet("附图")
    figures["A1"] = "见下图"
    figures.add_image(SheetImage(io.BytesIO(ocr_image)), "B2")
    workbook.create_sheet("空表")
    path = tmp_path / "book.xlsx"
    workbook.save(path)

    fake = FakeOcr("图中文字")
    parsed = parse(path, fake)
    assert [segment.sheet for segment in parsed.segments] == ["报价", "附图"]
    assert table_rows(parsed.segments[0].text) == ["| 项目 | 金额 |", "| --- | --- |", "| 设备 | 100 |", "|  | 5 |"]
    assert "见下图" in parsed.segments[1].text and "图中文字" in parsed.segments[1].text
    assert parsed.ocr_images == len(fake.images) == 1


# ---------------------------------------------------------------- 工作表、网页、电子书


def test_spreadsheet_one_segment_per_sheet(samples: Path) -> None:
    parsed = parse(samples / "zh.xlsx", None)
    assert parsed.format == "xlsx"
    assert [segment.sheet for segment in parsed.segments] == ["报价", "说明"]  # 空表不成段
    prices, notes = (segment.text for segment in parsed.segments)
    assert prices.startswith("## 报价\n\n| 项目 | 金额 |")
    assert table_rows(prices)[2:] == ["| 服务器 | 120000 |", "| 运维服务 | 36000 |"]
    assert "报价含税，有效期九十天" in notes and "服务器" not in notes


def assert_product_guide(markdown: str) -> None:
    """“产品指南”网页（生成的与 ragflow 的真实样例内容相同）转出的 Markdown：标题层级、段落与表格。"""
    lines = markdown.splitlines()
    assert lines[0] == "# 产品指南"
    assert "## 使用条款" in lines
    assert table_rows(markdown) == ["| 姓名 | 年龄 |", "| --- | --- |", "| 张三 | 30 |", "| 李四 | 25 |"]
    assert "欢迎使用我们的智能助手，它能帮你快速完成任务。" in lines


def test_zh_html_headings_and_table(samples: Path) -> None:
    parsed = parse(samples / "zh.html", None)
    assert parsed.format == "html"
    assert_product_guide(parsed.markdown)


def test_epub_title_author_and_chapter(samples: Path) -> None:
    path = samples / "zh.epub"
    assert detect_format(path.read_bytes()[:8192], "book.epub") == "epub"
    parsed = parse(path)
    assert parsed.format == "epub"
    for expected in ("政务云采购手册", "测试作者", "# 第一章 采购需求", "采购内容为政务云服务。"):
        assert expected in parsed.markdown

# ---------------------------------------------------------------- 编码


@pytest.mark.parametrize(("encoding", "sample"), [
    ("utf-8", ZH_SAMPLE),
    ("utf-8-sig", ZH_SAMPLE),
    ("utf-16", ZH_SAMPLE),
    ("gbk", ZH_SAMPLE),
    ("gb18030", ZH_SAMPLE + "𠀀"),
    ("big5", ZH_SAMPLE_TRADITIONAL),
    ("gbk", ZH_SAMPLE_TRADITIONAL),
    ("gbk", "总则"),
    ("big5", "總則"),
])
def test_txt_encodings(tmp_path: Path, encoding: str, sample: str) -> None:
    parsed = parse(write(tmp_path, "notice.txt", f"{sample}\r\n第二行".encode(encoding)))
    assert parsed.format == "txt"
    assert parsed.markdown == f"{sample}\n第二行"


def test_other_encodings_are_not_forced_into_chinese() -> None:
    assert decode_text("Hello café naïve".encode("cp1252")) == "Hello café naïve"
    assert decode_text("한국어 텍스트입니다. 테스트입니다.".encode("euc-kr")) == "한국어 텍스트입니다. 테스트입니다."


def test_markdown_is_kept_verbatim(tmp_path: Path) -> None:
    source = "# 招标公告\n\n- 第一条\n- 第二条\n\n| 项目 | 金额 |\n| --- | --- |\n| 设备 | 100 |"
    parsed = parse(write(tmp_path, "公告.md", source.encode("gbk")))
    assert parsed.format == "markdown" and parsed.markdown == source


def test_html_in_gbk_with_and_without_meta_charset(tmp_path: Path) -> None:
    body = (f"<h1>招标文件</h1><p>{ZH_SAMPLE}</p>"
            "<table><tr><th>项目</th><th>金额</th></tr><tr><td>设备</td><td>100</td></tr></table>")
    meta = '<meta http-equiv="Content-Type" content="text/html; charset=gb2312">'
    with_meta = f"<html><head>{meta}</head><body>{body}</body></html>"
    for name, html in (("meta.html", with_meta), ("plain.htm", f"<html><body>{body}</body></html>")):
        text = parse(write(tmp_path, name, html.encode("gbk"))).markdown
        assert text.splitlines()[0] == "# 招标文件"
        assert ZH_SAMPLE in text and "| 设备 | 100 |" in text


# ---------------------------------------------------------------- CSV

CSV_HEADER = ("姓名", "部门", "电话", "备注")
CSV_HEADER_ROW = "| 姓名 | 部门 | 电话 | 备注 |"


def csv_bytes(rows: int = 40, *, delimiter: str = ",", encoding: str = "utf-8", bom: bool = False) -> bytes:
    """表头 + ``rows`` 行的中文 CSV（Excel 的写法：\\r\\n 换行，含分隔符、引号、换行的字段加引号）。"""
    import csv

    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter=delimiter, lineterminator="\r\n")
    writer.writerow(CSV_HEADER)
    for index in range(1, rows + 1):
        writer.writerow([f"员工{index:03d}", "信息技术部", f"1380013{index:04d}",
                         f"负责政务云平台第{index}期的运维，含“安全”保障; 值班|轮岗"])
    data = buffer.getvalue().encode(encoding)
    return (b"\xef\xbb\xbf" if bom else b"") + data


@pytest.mark.parametrize("delimiter", [",", ";", "\t"])
@pytest.mark.parametrize(("encoding", "bom"), [("utf-8", False), ("utf-8", True), ("gbk", False), ("gb18030", False),
                                               ("utf-16", False)])
def test_csv_encodings_and_delimiters(tmp_path: Path, delimiter: str, encoding: str, bom: bool) -> None:
    parsed = parse(write(tmp_path, "名单.csv", csv_bytes(delimiter=delimiter, encoding=encoding, bom=bom)))
    assert parsed.format == "csv" and len(parsed.segments) > 1
    for segment in parsed.segments:
        lines = segment.text.splitlines()
        # 每组：行号标题、表头行、对齐行、数据行
        assert lines[0].startswith("## 第 ") and lines[2] == CSV_HEADER_ROW and lines[3] == "| --- | --- | --- | --- |"
    markdown = parsed.markdown
    assert "| 员工001 | 信息技术部 | 13800130001 | 负责政务云平台第1期的运维，含“安全”保障; 值班\\|轮岗 |" in markdown
    assert "员工040" in markdown and "\ufeff" not in markdown
    # 行号与表格软件一致：表头是第 1 行
    assert parsed.segments[0].text.startswith("## 第 2 至 ")
    assert parsed.segments[-1].text.splitlines()[0].endswith(" 41 行")


def test_sniff_delimiter_prefers_the_consistent_column_count() -> None:
    # 逗号出现在正文里、分号才是分隔符
    assert sniff_delimiter("名称;说明\n甲;一,二,三\n乙;四,五\n丙;六\n") == ";"
    assert sniff_delimiter("a\tb\tc\n1\t2\t3\n") == "\t"
    assert sniff_delimiter("只有一列\n第二行\n") == ","


def test_csv_chunks_each_carry_the_header_row(tmp_path: Path) -> None:
    """按默认的 token 分块（以及 recursive、paragraph、parent_child）：每个分块都从一组开头起，带着表头行。"""
    parsed = parse(write(tmp_path, "名单.csv", csv_bytes(rows=200)))
    tokenizer = Tokenizer.load(None)
    for strategy in ("token", "recursive", "paragraph", "parent_child"):
        drafts = chunk_text(parsed.markdown, ChunkingOptions(strategy=strategy), tokenizer=tokenizer)
        searchable = [draft for draft in drafts if draft.role != "parent"]
        assert len(searchable) > 3, strategy
        for draft in searchable:
            assert draft.text.startswith("## 第 ") and CSV_HEADER_ROW in draft.text, (strategy, draft.text[:80])
        covered = "".join(draft.text for draft in searchable)
        assert all(f"员工{index:03d}" in covered for index in range(1, 201)), strategy


def test_csv_ragged_rows_quoted_newlines_and_blank_lines(tmp_path: Path) -> None:
    data = ('\n编号,名称,说明\n1,服务器\n2,交换机,"带\n换行的说明",多出来的字段\n\n,,\n'
            '3,防火墙,"含 | 竖线"\r4,网闸,老式换行\n').encode()
    parsed = parse(write(tmp_path, "设备.csv", data))
    lines = parsed.markdown.splitlines()
    assert lines[2:4] == ["| 编号 | 名称 | 说明 |", "| --- | --- | --- |"]
    assert "| 1 | 服务器 |  |" in lines  # 缺的列补空
    assert "| 2 | 交换机 | 带 换行的说明, 多出来的字段 |" in lines  # 多出的字段并进最后一列
    assert "| 3 | 防火墙 | 含 \\| 竖线 |" in lines and "| 4 | 网闸 | 老式换行 |" in lines
    assert not any(line.startswith("|  |  |") for line in lines)  # 空行不算数据行
    # 只有表头也是内容
    assert parse(write(tmp_path, "空表.csv", "编号,名称\n".encode())).markdown == "| 编号 | 名称 |\n| --- | --- |"


def test_csv_limits_are_permanent_and_named(tmp_path: Path) -> None:
    # 引号没闭合：后面的全部内容进了一个字段，字段长度上限及时截住
    unclosed = "编号,说明\n1,\"没有闭合的引号\n" + "后面全是正文。" * (MAX_FIELD_CHARS // 5)
    with pytest.raises(LimitExceeded, match=r"longer than 131,072 characters.*quote") as excinfo:
        parse(write(tmp_path, "unclosed.csv", unclosed.encode()))
    assert excinfo.value.permanent
    wide = ",".join(f"c{index}" for index in range(MAX_COLUMNS + 1)) + "\n"
    with pytest.raises(LimitExceeded, match=r"1,001 fields, more than the limit of 1,000 columns"):
        parse(write(tmp_path, "wide.csv", wide.encode()))
    # 表头重复后的输出也受 RAG_INGEST_MAX_CHARS 约束（边生成边查）
    path = write(tmp_path, "long.csv", csv_bytes(rows=2000))
    with pytest.raises(LimitExceeded, match="RAG_INGEST_MAX_CHARS"):
        parse_document(path, filename="long.csv", ocr=None, limits=ParseLimits(max_chars=len(path.read_bytes()) // 2))


# ---------------------------------------------------------------- 格式识别（扩展名 + 内容）


def test_detect_format_by_extension_and_content(samples: Path) -> None:
    def head(name: str) -> bytes:
        return (samples / name).read_bytes()[:8192]

    assert detect_format(head("zh.docx"), "a.DOCX") == "docx"
    assert detect_format(head("zh.pdf"), "a.pdf") == "pdf"
    assert detect_format(head("zh.pptx"), "a.pptx") == "pptx"
    assert detect_format(head("zh.xlsx"), "a.xlsx") == "xlsx"
    assert detect_format(fake_ole("Workbook"), "a.xls") == "xls"
    assert detect_format(head("zh.html"), "a.htm") == "html"
    assert detect_format("# 标题".encode(), "a.markdown") == "markdown"
    assert detect_format("姓名,部门\n张三,信息技术部\n".encode("gbk"), "名单.CSV") == "csv"
    # 同一家族内按内容纠正：.xls 里其实是 xlsx 或网页导出的 HTML
    assert detect_format(head("zh.xlsx"), "export.xls") == "xlsx"
    assert detect_format(b"<html><body><table><tr><td>1</td></tr></table></body></html>", "export.xls") == "html"
    # 空文件按扩展名放行，解析时再报“文件为空”
    assert detect_format(b"", "empty.pdf") == "pdf"


def test_renamed_binaries_are_rejected(tmp_path: Path, samples: Path) -> None:
    png = png_bytes((64, 64))
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("hello.txt", "hi")
    cases = [
        (png, "x.txt", "PNG image"),
        (b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 4, "notes.txt", "ELF executable"),
        (bytes(range(256)) * 16, "x.pdf", "binary data"),
        (png, "x.pdf", "PNG image"),
        (zipped.getvalue(), "x.docx", "ZIP archive"),
        ((samples / "zh.xlsx").read_bytes(), "report.docx", "Excel workbook"),
        ((samples / "zh.pdf").read_bytes(), "scan.png", "PDF document"),
        (fake_ole("WordDocument"), "old.docx", "legacy Word 97-2003 document"),
        (b"MZ\x90\x00" + b"\x00" * 60 + b"This program cannot be run in DOS mode", "setup.txt", "Windows executable"),
    ]
    for data, name, looks_like in cases:
        with pytest.raises(UnsupportedFormatError, match=looks_like):
            detect_format(data[:8192], name)
        with pytest.raises(UnsupportedFormatError):
            parse(write(tmp_path, name, data))


def test_unknown_extension_is_rejected() -> None:
    with pytest.raises(UnsupportedFormatError, match=r"Unsupported file type '\.exe'"):
        detect_format(b"\x7fELF", "tool.exe")


# ---------------------------------------------------------------- 错误：加密、损坏、空文件


def test_encrypted_pdf_is_a_permanent_error(tmp_path: Path) -> None:
    path = write(tmp_path, "secret.pdf", make_pdf(["Secret budget 2024"], user="user"))
    with pytest.raises(ParseError, match=r"The PDF is encrypted \(password protected\)") as excinfo:
        parse(path)
    assert excinfo.value.permanent


def test_pdf_with_only_owner_password_still_parses(tmp_path: Path) -> None:
    """只有权限密码（打开密码为空）的 PDF 可以正常读出文字。"""
    path = write(tmp_path, "restricted.pdf", make_pdf(["Secret budget 2024"], user=""))
    assert parse(path).segments == (Segment("Secret budget 2024", page=1),)


def test_encrypted_office_document(tmp_path: Path) -> None:
    data = fake_ole("EncryptedPackage", "EncryptionInfo")
    for name in ("locked.docx", "locked.xlsx", "locked.pptx", "locked.xls"):
        assert detect_format(data, name) == name.rsplit(".", 1)[1]
        with pytest.raises(ParseError, match=r"encrypted \(password protected\)") as excinfo:
            parse(write(tmp_path, name, data))
        assert excinfo.value.permanent and not isinstance(excinfo.value, UnsupportedFormatError)


def test_truncated_docx_is_damaged(tmp_path: Path, samples: Path) -> None:
    data = (samples / "zh.docx").read_bytes()
    path = write(tmp_path, "cut.docx", data[: len(data) // 2])
    with pytest.raises(ParseError, match="damaged") as excinfo:
        parse(path)
    assert excinfo.value.permanent and not isinstance(excinfo.value, UnsupportedFormatError)


def test_corrupt_pdf_and_xlsx(tmp_path: Path, samples: Path) -> None:
    with pytest.raises(ParseError) as excinfo:
        parse(write(tmp_path, "bad.pdf", b"%PDF-1.7\n" + bytes(range(256)) * 8))
    assert excinfo.value.permanent
    data = (samples / "zh.xlsx").read_bytes()
    with pytest.raises(ParseError, match="damaged"):
        parse(write(tmp_path, "cut.xlsx", data[:3000]))


def test_empty_and_textless_files(tmp_path: Path) -> None:
    for name in ("empty.pdf", "empty.txt", "empty.docx"):
        with pytest.raises(ParseError, match=r"empty \(0 bytes\)") as excinfo:
            parse(write(tmp_path, name, b""))
        assert excinfo.value.permanent
    with pytest.raises(ParseError, match="No text could be extracted"):
        parse(write(tmp_path, "blank.txt", b" \r\n\t\n"))


# ---------------------------------------------------------------- 引擎选择


def test_get_ocr_engine_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    assert get_ocr_engine("none") is None
    with pytest.raises(ValueError, match="Unknown OCR engine"):
        get_ocr_engine("paddle")
    availability = ocr_available()
    assert set(availability) == {"rapidocr", "tesseract"}
    auto = get_ocr_engine("auto")
    if availability["rapidocr"]:
        assert auto is not None and auto.name == "rapidocr" and auto is get_ocr_engine("rapidocr")
    elif availability["tesseract"]:
        assert auto is not None and auto.name == "tesseract"
    else:
        assert auto is None

    warnings: list[tuple[str, dict[str, object]]] = []

    class Recorder:
        def warning(self, event: str, **fields: object) -> None:
            warnings.append((event, fields))

    monkeypatch.setattr(ocr_module, "logger", Recorder())
    monkeypatch.setitem(ocr_module._availability, "rapidocr", False)
    monkeypatch.setitem(ocr_module._availability, "tesseract", False)
    monkeypatch.setattr(ocr_module, "_warned", set())
    assert get_ocr_engine("tesseract") is None
    assert get_ocr_engine("auto") is None
    assert [event for event, _ in warnings] == ["ocr_engine_unavailable", "ocr_engine_unavailable"]
    assert warnings[0][1]["requested"] == "tesseract"
