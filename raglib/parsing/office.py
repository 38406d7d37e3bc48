"""Office 格式（DOCX、PPTX、XLSX、XLS）：markitdown 转 Markdown，内嵌图片经 OCR 放回原位置。

markitdown 0.1.8 的 DOCX/PPTX/XLSX 转换器提供 ``_image_to_html`` 钩子：返回的 HTML 片段会放在图片
所在的位置（DOCX 在正文中、PPTX 在该图所在幻灯片内、XLSX 在该图所在工作表的表格之后）。
我们在钩子里做 OCR，识别不出文字时返回 None，由 markitdown 保留原生图片标记（之后只留 alt 文字）。

转换前先检查容器：OLE 复合文件里有 ``EncryptedPackage`` 流 = 加了密码的 Office 文档；
坏掉的 ZIP = 文件损坏；ZIP 里没有对应的主部件 = 改了扩展名的别的文件。
"""

from __future__ import annotations

# markitdown 的转换器、openpyxl、xlrd 在函数里导入：较重，只有解析对应格式时才加载。
import functools
import html
import io
import mmap
import re
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

from raglib.parsing.base import ParseError, Segment
from raglib.parsing.detect import OLE_MAGIC, describe_ole, unsupported
from raglib.parsing.ocr_session import OcrSession
from raglib.parsing.text import images_to_alt_text, tidy

LABELS: dict[str, str] = {
    "docx": "Word document (.docx)",
    "pptx": "PowerPoint presentation (.pptx)",
    "xlsx": "Excel workbook (.xlsx)",
    "xls": "Excel 97-2003 workbook (.xls)",
}
# ZIP 包里必须有的部件目录
_PACKAGE_PREFIX = {"docx": "word/", "pptx": "ppt/", "xlsx": "xl/"}
_PACKAGE_DESCRIPTIONS = (
    ("word/", "a Word document (.docx)"),
    ("xl/", "an Excel workbook (.xlsx)"),
    ("ppt/", "a PowerPoint presentation (.pptx)"),
)

_SLIDE_MARKER = re.compile(r"<!-- Slide number: (\d+) -->")
_NAN_CELL = re.compile(r"(?<=\|) (?:NaN|Unnamed: \d+) (?=\|)")
# 只剩表格骨架（竖线、分隔线、空白）的内容：空工作表
_TABLE_SKELETON = re.compile(r"[|\-\s]*")

ENCRYPTED_MESSAGE = "The Office document is encrypted (password protected)"


def check_container(path: Path, fmt: str) -> str:
    """转换前检查容器，返回实际应使用的格式（.xlsx 里其实是旧版 xls 时返回 "xls"）。"""
    label = LABELS[fmt]
    with path.open("rb") as handle:
        magic = handle.read(len(OLE_MAGIC))
    if magic == OLE_MAGIC:
        with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            # 目录扇区可能在文件任何位置：内存映射整文件查找流名，不整体读入内存
            kind = describe_ole(mapped)
        if kind.kind == "ole-encrypted":
            raise ParseError(ENCRYPTED_MESSAGE)
        if fmt == "xls" or (fmt == "xlsx" and kind.kind == "ole-xls"):
            return "xls"
        raise unsupported(f"The file is named .{fmt} but its content looks like {kind.description}")
    if fmt == "xls":
        return fmt
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile as exc:
        raise ParseError(f"The {label} is damaged: it is not a readable ZIP archive ({exc})") from exc
    prefix = _PACKAGE_PREFIX[fmt]
    if not any(name.startswith(prefix) for name in names):
        found = next((text for start, text in _PACKAGE_DESCRIPTIONS if any(n.startswith(start) for n in names)),
                     "a ZIP archive")
        raise unsupported(f"The file is named .{fmt} but it is {found} without {prefix} parts")
    return fmt


def _ocr_fragment(session: OcrSession, stream: BinaryIO, where: str) -> str | None:
    """钩子共用：OCR 一张图，返回 HTML 段落（逐行 <br>），识别不出文字返回 None。"""
    text = session.recognize_bytes(stream.read(), where=where)
    lines = [html.escape(line.strip()) for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    return "<p>" + "<br>".join(lines) + "</p>"


def _slide_place(shape: Any) -> str:
    """PPTX 形状所在的幻灯片号与形状名（如 `` on slide 2 ('Picture 3')``）；取不到时为空串。"""
    try:
        presentation = shape.part.package.presentation_part.presentation
        number = presentation.slides.index(shape.part.slide) + 1
    except Exception:  # 畸形的包结构：位置只是说明里的附加信息，取不到不影响解析
        return ""
    return f" on slide {number} ('{str(shape.name)[:100]}')"


@functools.cache
def _converter_classes() -> dict[str, Any]:
    """markitdown 导入较慢（会带上 pandas），延迟到第一次解析 Office 文件时再导入。"""
    from markitdown.converters import DocxConverter, PptxConverter, XlsConverter, XlsxConverter

    def with_ocr(base: type, label: str) -> type:
        """给 markitdown 的转换器装上 OCR：图片在原位置换成识别出的文字。"""

        class OcrConverter(base):  # type: ignore[misc, valid-type]
            def __init__(self, session: OcrSession) -> None:
                super().__init__()
                self.session = session
                self.count = 0
                # 当前图片在文件里的位置（目前只有 PPTX 知道：幻灯片号与形状名），写进日志与文档上的说明
                self.place = ""

            def _convert_picture_to_markdown(self, shape: Any, **kwargs: Any) -> str:
                # 只有 PptxConverter 有这个方法：markitdown 逐张幻灯片、逐个形状调用它，再调用下面的钩子
                self.place = _slide_place(shape)
                return str(super()._convert_picture_to_markdown(shape, **kwargs))

            def _image_to_html(self, image_stream: BinaryIO, stream_info: Any, **kwargs: Any) -> str | None:
                self.count += 1
                return _ocr_fragment(self.session, image_stream, f"{label} {self.count}{self.place}")

        return OcrConverter

    class PlainXlsConverter(XlsConverter):  # type: ignore[misc]
        def __init__(self, session: OcrSession) -> None:
            super().__init__()

    return {
        "docx": with_ocr(DocxConverter, "docx image"),
        "pptx": with_ocr(PptxConverter, "pptx picture"),
        "xlsx": with_ocr(XlsxConverter, "xlsx image"),
        "xls": PlainXlsConverter,
    }


def _is_encryption_error(exc: BaseException) -> bool:
    return "encrypt" in str(exc).lower()


def _convert(path: Path, fmt: str, session: OcrSession) -> str:
    """调用 markitdown 转换器，把库内异常翻译成 ParseError。"""
    from markitdown import StreamInfo

    converter = _converter_classes()[fmt](session)
    label = LABELS[fmt]
    try:
        with path.open("rb") as handle:
            stream = io.BytesIO(handle.read())
        result = converter.convert(stream, StreamInfo(extension=f".{fmt}"))
    except ParseError:
        raise
    except MemoryError:
        # 不翻译成“可重试”：解析子进程里内存耗尽就是撞到了 RAG_INGEST_PARSE_MEMORY，再试也一样（documents.sandbox 报告）
        raise
    except Exception as exc:  # 各库（mammoth/python-pptx/openpyxl/xlrd/pandas）的异常类型不一，统一翻译
        if _is_encryption_error(exc):
            raise ParseError(ENCRYPTED_MESSAGE) from exc
        raise ParseError(f"The {label} is damaged or could not be read: {type(exc).__name__}: {exc}") from exc
    return str(result.markdown or "")


def parse_docx(path: Path, session: OcrSession) -> list[Segment]:
    """DOCX：整篇一个片段（标题、列表、表格按 markitdown 的 Markdown），图片 OCR 文字在图片原位置。"""
    check_container(path, "docx")
    text = tidy(images_to_alt_text(_convert(path, "docx", session)))
    return [Segment(text=text)] if text else []


def parse_pptx(path: Path, session: OcrSession) -> list[Segment]:
    """PPTX：每张幻灯片一个片段（slide 从 1 开始），图片 OCR 文字在所属幻灯片内。"""
    check_container(path, "pptx")
    markdown = _convert(path, "pptx", session)
    segments: list[Segment] = []
    parts = _SLIDE_MARKER.split(markdown)
    # split 结果：[标记前的内容, 编号1, 内容1, 编号2, 内容2, ...]
    for number, body in zip(parts[1::2], parts[2::2], strict=True):
        text = tidy(images_to_alt_text(body))
        if text:
            segments.append(Segment(text=text, slide=int(number)))
    return segments


def _sheet_names(path: Path, fmt: str) -> list[str]:
    """按工作簿顺序的工作表名（与 markitdown/pandas 的顺序一致）。"""
    if fmt == "xlsx":
        import openpyxl

        workbook = openpyxl.load_workbook(path, read_only=True)
        try:
            return list(workbook.sheetnames)
        finally:
            workbook.close()
    import xlrd

    book = xlrd.open_workbook(str(path), on_demand=True)
    try:
        return list(book.sheet_names())
    finally:
        book.release_resources()


def _split_sheets(markdown: str, names: list[str]) -> list[tuple[str, str]]:
    """按 markitdown 写出的 ``## 表名`` 行把整篇切成 (表名, 内容)；依次向后查找，不会被单元格内容误导。"""
    positions: list[tuple[str, int, int]] = []
    cursor = 0
    for name in names:
        heading = f"## {name}\n"
        found = markdown.find(heading, cursor)
        if found < 0 and markdown.endswith(f"## {name}"):
            found = len(markdown) - len(heading) + 1
        if found < 0:
            continue
        positions.append((name, found, found + len(heading)))
        cursor = found + len(heading)
    parts = []
    for index, (name, _start, body_start) in enumerate(positions):
        end = positions[index + 1][1] if index + 1 < len(positions) else len(markdown)
        parts.append((name, markdown[body_start:end]))
    return parts


def parse_spreadsheet(path: Path, session: OcrSession, fmt: str) -> list[Segment]:
    """XLSX/XLS：每个工作表一个片段（sheet=表名），内容是带表名标题的 Markdown 表格。"""
    fmt = check_container(path, fmt)
    markdown = _convert(path, fmt, session)
    try:
        names = _sheet_names(path, fmt)
    except Exception as exc:  # 转换已成功，读表名失败不应发生；真发生时按损坏处理
        raise ParseError(f"The {LABELS[fmt]} is damaged or could not be read: {exc}") from exc
    segments: list[Segment] = []
    for name, body in _split_sheets(markdown, names):
        body = tidy(images_to_alt_text(_NAN_CELL.sub("  ", body)))
        if not _TABLE_SKELETON.fullmatch(body):
            segments.append(Segment(text=f"## {name}\n\n{body}", sheet=name))
    return segments


def parse_xlsx(path: Path, session: OcrSession) -> list[Segment]:
    return parse_spreadsheet(path, session, "xlsx")


def parse_xls(path: Path, session: OcrSession) -> list[Segment]:
    return parse_spreadsheet(path, session, "xls")
