"""测试时生成的中文样例文档：每种支持的格式都在运行时造出来，不依赖仓库外的文件。

图片里的文字用测试引导脚本安装的 CJK 字体（fonts-wqy-zenhei）渲染，OCR 断言的是识别出的内容；
PDF 既有带文字层（含内嵌图片）的页，也有只有扫描图的页。真实的第三方样例（../shared/data）
只作为额外一层，见 tests/raglib/test_shared_fixtures.py。
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

# 全文检索测试用的八段短文：中英混合，有共同的词（高血压、乙肝、肝功能）也有只出现一次的词（党参）
MEDICAL_TEXTS = [
    "高血压患者可以服用党参，党参有降血压的作用。",
    "乙肝病毒携带者需要定期复查肝功能和乙肝五项。",
    "胃胀多由饮食不规律引起，建议少食多餐。",
    "Hypertension patients should monitor blood pressure daily.",
    "高血压 hypertension 与糖尿病常常同时出现，需要控制饮食。",
    "肝功能异常时应避免饮酒，并复查乙肝病毒定量。",
    "感冒发烧多喝水，注意休息。",
    "The liver function test includes ALT and AST.",
]

# 测试引导（scripts/test.sh → scripts/bootstrap.sh --test）安装的字体；也认 Noto CJK
CJK_FONTS = (
    Path("/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc"),
    Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"),
)

# 正文与表格
BODY = "我是文字，这是招标文件第一章的正文。"
TABLE = (("我是表格1", "我是表格2"), ("我是表格3", "我是表格4"))
# 图片（OCR）里的文字：字号大、背景干净，rapidocr 与 tesseract 都能稳定识别
PICTURE_LINES = ("横向文本框", "图片里的中文", "English text")
SCAN_LINES = ("扫描页第一行", "投标人资格要求")


def cjk_font() -> Path:
    """找一个 CJK 字体；没有就明确失败（字体由测试引导安装，缺了说明环境没准备好）。"""
    for path in CJK_FONTS:
        if path.is_file():
            return path
    pytest.fail("缺少 CJK 字体：运行 `bash scripts/test.sh`（它会安装 fonts-wqy-zenhei），"
                "或 apt-get install fonts-wqy-zenhei", pytrace=False)


def text_picture(lines: tuple[str, ...] = PICTURE_LINES, *, font_size: int = 40, fmt: str = "PNG",
                 canvas: tuple[int, int] | None = None) -> bytes:
    """白底黑字的图片，每个字符串一行；给了 ``canvas`` 就画在这么大的画布左上方（如整页扫描）。"""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype(str(cjk_font()), font_size)
    line_height = int(font_size * 1.8)
    width = max(int(font.getlength(line)) for line in lines) + 2 * font_size
    picture = Image.new("RGB", canvas or (width, line_height * len(lines) + font_size), "white")
    draw = ImageDraw.Draw(picture)
    for index, line in enumerate(lines):
        draw.text((font_size, font_size // 2 + index * line_height), line, fill="black", font=font)
    buffer = io.BytesIO()
    picture.save(buffer, format=fmt)
    return buffer.getvalue()


def zh_docx() -> bytes:
    """标题、正文、两行两列的表格，表格之后一张带文字的图片。"""
    import docx
    from docx.shared import Cm

    document = docx.Document()
    document.add_heading("第一章 总则", level=1)
    document.add_paragraph(BODY)
    table = document.add_table(rows=2, cols=2)
    for row, values in zip(table.rows, TABLE, strict=True):
        for cell, value in zip(row.cells, values, strict=True):
            cell.text = value
    document.add_picture(io.BytesIO(text_picture()), width=Cm(8))
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def zh_pptx() -> bytes:
    """两张幻灯片：第一张有文本框、表格与图片，第二张只有文字。"""
    from pptx import Presentation
    from pptx.util import Cm

    presentation = Presentation()
    blank = presentation.slide_layouts[6]
    first = presentation.slides.add_slide(blank)
    first.shapes.add_textbox(Cm(1), Cm(1), Cm(10), Cm(2)).text_frame.text = BODY
    table = first.shapes.add_table(2, 2, Cm(1), Cm(4), Cm(10), Cm(3)).table
    for row_index, values in enumerate(TABLE):
        for column_index, value in enumerate(values):
            table.cell(row_index, column_index).text = value
    first.shapes.add_picture(io.BytesIO(text_picture()), Cm(12), Cm(4), width=Cm(10))
    second = presentation.slides.add_slide(blank)
    second.shapes.add_textbox(Cm(1), Cm(1), Cm(10), Cm(2)).text_frame.text = "第二张幻灯片：评分办法"
    buffer = io.BytesIO()
    presentation.save(buffer)
    return buffer.getvalue()


def zh_xlsx() -> bytes:
    """两个有内容的工作表与一个空表。"""
    import openpyxl

    workbook = openpyxl.Workbook()
    prices = workbook.active
    prices.title = "报价"
    prices.append(["项目", "金额"])
    prices.append(["服务器", 120000])
    prices.append(["运维服务", 36000])
    notes = workbook.create_sheet("说明")
    notes.append(["备注"])
    notes.append(["报价含税，有效期九十天"])
    workbook.create_sheet("空表")
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()


def zh_pdf() -> bytes:
    """第 1 页：中文文字层 + 一张带文字的图片；第 2 页：只有一张整页扫描图（没有文字层）。"""
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.add_font("cjk", fname=str(cjk_font()))
    pdf.set_font("cjk", size=14)
    pdf.add_page()
    pdf.multi_cell(0, 10, f"{BODY}\n投标人应当具备承担招标项目的能力。")
    pdf.image(io.BytesIO(text_picture()), x=20, y=60, w=90)
    pdf.add_page()
    # A4 比例（150 dpi）的整页扫描图，不拉伸
    pdf.image(io.BytesIO(text_picture(SCAN_LINES, font_size=56, canvas=(1240, 1754))), x=0, y=0, w=210, h=297)
    return bytes(pdf.output())


def scanned_pdf(lines: tuple[str, ...] = PICTURE_LINES) -> bytes:
    """没有文字层的 PDF：一张图片直接存成 PDF（扫描仪的典型输出）。"""
    from PIL import Image

    buffer = io.BytesIO()
    Image.open(io.BytesIO(text_picture(lines))).save(buffer, format="PDF", resolution=100)
    return buffer.getvalue()


ZH_HTML = """<!DOCTYPE html>
<html lang="zh"><head><meta charset="utf-8"><title>产品指南</title></head>
<body><h1>产品指南</h1><p>欢迎使用我们的智能助手，它能帮你快速完成任务。</p>
<h2>使用条款</h2><table><tr><th>姓名</th><th>年龄</th></tr><tr><td>张三</td><td>30</td></tr>
<tr><td>李四</td><td>25</td></tr></table></body></html>"""


def zh_epub() -> bytes:
    """最小的 EPUB 3：一章中文正文，带书名与作者元数据。"""
    chapter = ("<?xml version='1.0' encoding='utf-8'?><html xmlns='http://www.w3.org/1999/xhtml'><head>"
               "<title>第一章</title></head><body><h1>第一章 采购需求</h1><p>采购内容为政务云服务。</p>"
               "</body></html>")
    opf = ("<?xml version='1.0' encoding='utf-8'?><package xmlns='http://www.idpf.org/2007/opf' version='3.0' "
           "unique-identifier='id'><metadata xmlns:dc='http://purl.org/dc/elements/1.1/'>"
           "<dc:identifier id='id'>ragservice-test</dc:identifier><dc:title>政务云采购手册</dc:title>"
           "<dc:creator>测试作者</dc:creator><dc:language>zh</dc:language></metadata>"
           "<manifest><item id='c1' href='c1.xhtml' media-type='application/xhtml+xml'/></manifest>"
           "<spine><itemref idref='c1'/></spine></package>")
    container = ("<?xml version='1.0'?><container version='1.0' xmlns='urn:oasis:names:tc:opendocument:xmlns:"
                 "container'><rootfiles><rootfile full-path='OEBPS/content.opf' "
                 "media-type='application/oebps-package+xml'/></rootfiles></container>")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        archive.writestr("META-INF/container.xml", container)
        archive.writestr("OEBPS/content.opf", opf)
        archive.writestr("OEBPS/c1.xhtml", chapter)
    return buffer.getvalue()
