"""PDF：pdfminer 逐页取文字层，每页一个片段（page 从 1 开始）；需要时用 pypdfium2 渲染后 OCR。

每页的 OCR 决策（文字层字符数不计空白与 ``(cid:N)`` 乱码）：
- 文字层不足 ``MIN_PAGE_CHARS`` 且图片覆盖大半页（扫描件），或既没有文字层也没有图片（文字转曲线的页面）
  → 整页渲染 OCR；文字层里已有的少量文字若不在 OCR 结果里，放在 OCR 文字之前；空白页渲染后是纯色，不送识别；
- 文字层充足且有一张铺满整页的图 → 视为“已 OCR 过的扫描件”或整页底图，不再识别；
- 其余有图片的页面（包括文字很少、图片只占一部分的页面）→ 渲染后只裁出图片区域识别，
  文字接在该页文字层之后：文字层原样保留，且比整页识别快数倍。
渲染失败或没有 pypdfium2 时记为 OCR 跳过，文字层照常返回。
"""

from __future__ import annotations

# pdfminer、pypdfium2 在函数里导入：它们较重，只有真正解析 PDF 的进程（解析沙箱子进程）才需要加载。
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from raglib.parsing.base import ParseError, Segment
from raglib.parsing.ocr_session import OcrSession
from raglib.parsing.text import tidy

logger = structlog.get_logger(__name__)

# 文字层少于这么多个非空白字符的页面视为“几乎没有文字层”
MIN_PAGE_CHARS = 20
# 图片（页面坐标，单位 pt）任一边小于该值不识别；原始像素任一边小于 32 也不识别
MIN_IMAGE_POINTS = 16.0
MIN_IMAGE_PIXELS = 32
# 文字层充足、图片总面积又超过页面这个比例：视为已 OCR 过的扫描页或整页底图
FULL_PAGE_COVERAGE = 0.8
# 文字层不足、图片总面积超过页面这个比例：视为扫描页，整页识别
SCAN_COVERAGE = 0.5
# 每页最多裁图识别的张数（按面积取最大的几张），防止碎图把耗时拖垮
MAX_IMAGES_PER_PAGE = 12
RENDER_DPI = 200
MAX_RENDER_SIDE = 3500

_CID = re.compile(r"\(cid:\d+\)")
_WHITESPACE = re.compile(r"\s+")

ENCRYPTED_MESSAGE = "The PDF is encrypted (password protected)"


@dataclass(frozen=True)
class _Box:
    """页面坐标系（pdfminer：原点在左下，单位 pt）中的矩形。"""

    x0: float
    y0: float
    x1: float
    y1: float

    @property
    def area(self) -> float:
        return max(self.x1 - self.x0, 0.0) * max(self.y1 - self.y0, 0.0)

    def contains(self, other: _Box) -> bool:
        return (self.x0 - 1 <= other.x0 and self.y0 - 1 <= other.y0
                and other.x1 <= self.x1 + 1 and other.y1 <= self.y1 + 1)


@dataclass
class _PageContent:
    text: str
    images: list[_Box]
    width: float
    height: float


def _collect(layout: Any) -> _PageContent:
    """按 pdfminer TextConverter 的顺序拼出文字，同时收集有意义的图片区域。"""
    from pdfminer.layout import LTContainer, LTImage, LTText, LTTextBox

    parts: list[str] = []
    images: list[_Box] = []
    page_x0, page_y0, page_x1, page_y1 = layout.bbox

    def render(item: Any) -> None:
        if isinstance(item, LTContainer):
            for child in item:
                render(child)
        elif isinstance(item, LTText):
            parts.append(item.get_text())
        if isinstance(item, LTTextBox):
            parts.append("\n")
        elif isinstance(item, LTImage):
            x0, y0 = max(item.x0, page_x0), max(item.y0, page_y0)
            x1, y1 = min(item.x1, page_x1), min(item.y1, page_y1)
            src_w, src_h = (item.srcsize or (0, 0))
            if (x1 - x0 >= MIN_IMAGE_POINTS and y1 - y0 >= MIN_IMAGE_POINTS
                    and (src_w or 0) >= MIN_IMAGE_PIXELS and (src_h or 0) >= MIN_IMAGE_PIXELS):
                images.append(_Box(x0, y0, x1, y1))

    render(layout)
    return _PageContent(text=tidy(_CID.sub("", "".join(parts))), images=_distinct(images),
                        width=page_x1 - page_x0, height=page_y1 - page_y0)


def _distinct(boxes: list[_Box]) -> list[_Box]:
    """去掉重复与被包含的图片区域（同一张图常因蒙版/分块被报告多次），按面积从大到小。"""
    kept: list[_Box] = []
    for box in sorted(boxes, key=lambda b: b.area, reverse=True):
        if not any(existing.contains(box) for existing in kept):
            kept.append(box)
    return kept


def _char_count(text: str) -> int:
    return len(_WHITESPACE.sub("", text))


class _Renderer:
    """按需打开 pypdfium2 文档并渲染页面；渲染不了时返回 None（由调用方记为 OCR 跳过）。"""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._document: Any = None
        self._broken = False

    def render(self, page_number: int) -> tuple[Any, float] | None:
        """渲染第 page_number 页（从 1 开始），返回 (PIL 图像, 每 pt 的像素数)。"""
        if self._broken:
            return None
        try:
            if self._document is None:
                import pypdfium2

                self._document = pypdfium2.PdfDocument(str(self.path))
            page = self._document[page_number - 1]
            try:
                width, height = page.get_size()
                scale = min(RENDER_DPI / 72, MAX_RENDER_SIDE / max(width, height, 1.0))
                picture = page.render(scale=scale).to_pil()
            finally:
                page.close()
        except ImportError:
            self._broken = True
            logger.warning("pdf_render_unavailable", reason="pypdfium2 is not installed")
            return None
        except Exception as exc:  # pdfium 对个别页面/文件报错时只影响 OCR，文字层照常
            logger.warning("pdf_render_failed", page=page_number, error=repr(exc))
            return None
        return picture.convert("RGB"), scale

    def close(self) -> None:
        if self._document is not None:
            self._document.close()


def _crop(picture: Any, box: _Box, content: _PageContent) -> Any:
    """把页面坐标的矩形换算成渲染图上的像素区域（按渲染图与页面的实际比例，四周留少量边距）。"""
    scale_x = picture.width / max(content.width, 1.0)
    scale_y = picture.height / max(content.height, 1.0)
    margin = 4.0
    left = max(int((box.x0 - margin) * scale_x), 0)
    right = min(int((box.x1 + margin) * scale_x), picture.width)
    top = max(int((content.height - box.y1 - margin) * scale_y), 0)
    bottom = min(int((content.height - box.y0 + margin) * scale_y), picture.height)
    return picture.crop((left, top, right, bottom))


def _merge_full_page(text_layer: str, ocr_text: str) -> str:
    """整页 OCR 结果通常已包含文字层的那几个字；不包含时把文字层放在前面，避免丢字。"""
    if not ocr_text:
        return text_layer
    if not text_layer or _WHITESPACE.sub("", text_layer) in _WHITESPACE.sub("", ocr_text):
        return ocr_text
    return f"{text_layer}\n\n{ocr_text}"


def _page_text(number: int, content: _PageContent, renderer: _Renderer, session: OcrSession) -> str:
    page_area = max(content.width * content.height, 1.0)
    coverage = sum(box.area for box in content.images) / page_area
    few_chars = _char_count(content.text) < MIN_PAGE_CHARS

    # 没有图片：有文字层就信文字层（短标题页很常见）；完全没有文字时才整页识别（文字转曲线的页面）
    if (not content.images and not content.text) or (few_chars and coverage >= SCAN_COVERAGE):
        if content.images and session.engine is None:
            session.note_unrecognized()
            return content.text
        rendered = renderer.render(number)
        if rendered is None:
            if content.images:
                session.note_unrecognized()
            return content.text
        ocr_text = session.recognize_picture(rendered[0], where=f"pdf page {number}")
        return _merge_full_page(content.text, ocr_text)

    if not content.images or (not few_chars and coverage >= FULL_PAGE_COVERAGE):
        return content.text
    if session.engine is None:
        session.note_unrecognized()
        return content.text
    rendered = renderer.render(number)
    if rendered is None:
        session.note_unrecognized()
        return content.text
    texts = [content.text] if content.text else []
    for index, box in enumerate(content.images[:MAX_IMAGES_PER_PAGE], start=1):
        recognized = session.recognize_picture(_crop(rendered[0], box, content),
                                               where=f"pdf page {number} image {index}")
        if recognized:
            texts.append(recognized)
    return "\n\n".join(texts)


def parse_pdf(path: Path, session: OcrSession) -> list[Segment]:
    """逐页解析 PDF。加密（需要打开密码）与损坏的文件抛 ParseError。"""
    from pdfminer.high_level import extract_pages
    from pdfminer.layout import LAParams
    from pdfminer.pdfdocument import PDFEncryptionError, PDFPasswordIncorrect
    from pdfminer.psexceptions import PSException

    renderer = _Renderer(path)
    segments: list[Segment] = []
    try:
        for number, layout in enumerate(extract_pages(path, laparams=LAParams()), start=1):
            text = tidy(_page_text(number, _collect(layout), renderer, session))
            if text:
                segments.append(Segment(text=text, page=number))
    except PDFPasswordIncorrect as exc:
        raise ParseError(ENCRYPTED_MESSAGE) from exc
    except PDFEncryptionError as exc:
        raise ParseError(f"{ENCRYPTED_MESSAGE}, or uses an unsupported encryption method ({exc})") from exc
    except (PSException, ValueError, KeyError, TypeError, AssertionError, EOFError) as exc:
        # pdfminer 遇到损坏的文件时抛出的异常并不都继承自 PSException
        raise ParseError(f"The PDF is damaged or could not be read: {type(exc).__name__}: {exc}") from exc
    except MemoryError as exc:
        raise ParseError("Ran out of memory while reading the PDF", permanent=False) from exc
    finally:
        renderer.close()
    return segments
