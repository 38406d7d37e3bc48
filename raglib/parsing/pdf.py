"""PDF：pdfminer 逐页取文字层，每页一个片段（page 从 1 开始）；需要时用 pypdfium2 渲染后 OCR。

每页的 OCR 决策（文字层字符数不计空白与 ``(cid:N)`` 乱码）：
- 文字层不足 ``MIN_PAGE_CHARS`` 且图片覆盖大半页（扫描件），或既没有文字层也没有图片（文字转曲线的页面）
  → 整页渲染 OCR；文字层里已有的少量文字若不在 OCR 结果里，放在 OCR 文字之前；空白页渲染后是纯色，不送识别；
- 文字层充足且有一张铺满整页的图 → 视为“已 OCR 过的扫描件”或整页底图，不再识别；
- 其余有图片的页面（包括文字很少、图片只占一部分的页面）→ 渲染后只裁出图片区域识别，
  文字接在该页文字层之后：文字层原样保留，且比整页识别快数倍。
渲染失败或没有 pypdfium2 时记为 OCR 跳过，文字层照常返回。

压缩流（FlateDecode）解压后的大小有上限（``ParseLimits.max_archive_member``，即 RAG_INGEST_MAX_ARCHIVE_MEMBER）：
1 MB 的文件可以藏一个解压成 1.5 GB 的内容流（解压炸弹），pdfminer 会把它整个解到内存里再逐字解析。
超限立即以 ``LimitExceeded``（永久失败）结束，而不是等子进程撞到内存上限。
内存不够时 ``MemoryError`` 原样抛出，不翻译成“可重试”：在解析子进程里它就是撞到了 RAG_INGEST_PARSE_MEMORY，
同一个文件再试也一样，由 ``documents.sandbox`` 报告为点名该上限的永久失败。
"""

from __future__ import annotations

# pdfminer、pypdfium2 在函数里导入：它们较重，只有真正解析 PDF 的进程（解析沙箱子进程）才需要加载。
import functools
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from raglib.parsing.base import ParseError, Segment
from raglib.parsing.limits import LimitExceeded
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


# ---------------------------------------------------------------- 压缩流的解压上限


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):.0f} MB"


def stream_too_large(limit: int) -> LimitExceeded:
    return LimitExceeded(
        f"A compressed stream in the PDF unpacks to more than {_megabytes(limit)}, the limit per compressed part "
        "(RAG_INGEST_MAX_ARCHIVE_MEMBER); the file looks like a decompression bomb")


@dataclass
class _StreamBudget:
    """一次 PDF 解析的解压上限；``exceeded`` 记下第一次超限，万一异常在 pdfminer 内部被吞掉也能事后报告。"""

    limit: int
    exceeded: bool = False

    def check(self, size: int) -> None:
        if size > self.limit:
            self.exceeded = True
            raise stream_too_large(self.limit)


# 当前线程（上下文）里正在进行的 PDF 解析的上限；None 表示不限（pdfminer 在别处被使用时行为不变）
_BUDGET: ContextVar[_StreamBudget | None] = ContextVar("pdf_stream_budget", default=None)


class _BoundedDecompressor:
    """zlib.decompressobj 的替身：累计输出超过上限即抛出（pdfminer 的 decompress_corrupted 逐字节用它）。"""

    def __init__(self, inner: Any, budget: _StreamBudget) -> None:
        self._inner = inner
        self._budget = budget
        self._produced = 0

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        room = self._budget.limit - self._produced + 1
        out: bytes = self._inner.decompress(data, min(max_length, room) if max_length else room)
        self._produced += len(out)
        self._budget.check(self._produced)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _BoundedZlib:
    """装进 ``pdfminer.pdftypes`` 的 zlib 替身：只在 ``_BUDGET`` 有值（正在 parse_pdf 里）时限制解压大小。

    pdfminer 的 ``PDFStream.decode`` 直接调用模块级的 ``zlib.decompress``，没有任何大小参数，也没有可替换的钩子；
    换掉它引用的模块对象是唯一不复制 pdfminer 代码的办法。上限放在 ContextVar 里，多线程各管各的。
    """

    error = zlib.error

    def __getattr__(self, name: str) -> Any:
        return getattr(zlib, name)

    @staticmethod
    def decompress(data: bytes, *args: Any, **kwargs: Any) -> bytes:
        budget = _BUDGET.get()
        if budget is None or args or kwargs:
            return zlib.decompress(data, *args, **kwargs)
        inflater = zlib.decompressobj()
        # 最多解出 上限+1 字节：多出的那一个字节就说明超限，炸弹不会被整个解到内存里
        out = inflater.decompress(data, budget.limit + 1)
        budget.check(len(out))
        if not inflater.eof:
            # 与 zlib.decompress 一致：流不完整时报错（pdfminer 据此退到逐字节的容错解压）
            raise zlib.error("Error -5 while decompressing data: incomplete or truncated stream")
        return out

    @staticmethod
    def decompressobj(*args: Any, **kwargs: Any) -> Any:
        inner = zlib.decompressobj(*args, **kwargs)
        budget = _BUDGET.get()
        return inner if budget is None else _BoundedDecompressor(inner, budget)


@functools.cache
def _install_bounded_zlib() -> None:
    import pdfminer.pdftypes

    pdfminer.pdftypes.zlib = _BoundedZlib()  # type: ignore[assignment]


@contextmanager
def bounded_streams(budget: _StreamBudget) -> Iterator[None]:
    """在这段代码里，pdfminer 解压的每个 FlateDecode 流最多 ``budget.limit`` 字节，超限抛 ``LimitExceeded``。"""
    _install_bounded_zlib()
    token = _BUDGET.set(budget)
    try:
        yield
    finally:
        _BUDGET.reset(token)


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
        except MemoryError:
            # 内存耗尽不是“这一页渲染不了”：交给调用方（解析子进程里即 RAG_INGEST_PARSE_MEMORY 超限）
            raise
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
    """逐页解析 PDF。加密（需要打开密码）与损坏的文件抛 ParseError，解压炸弹抛 LimitExceeded。"""
    from pdfminer.high_level import extract_pages
    from pdfminer.layout import LAParams
    from pdfminer.pdfdocument import PDFEncryptionError, PDFPasswordIncorrect
    from pdfminer.psexceptions import PSException

    renderer = _Renderer(path)
    budget = _StreamBudget(session.limits.max_archive_member)
    segments: list[Segment] = []
    try:
        with bounded_streams(budget):
            for number, layout in enumerate(extract_pages(path, laparams=LAParams()), start=1):
                text = tidy(_page_text(number, _collect(layout), renderer, session))
                if text:
                    segments.append(Segment(text=text, page=number))
    except PDFPasswordIncorrect as exc:
        raise ParseError(ENCRYPTED_MESSAGE) from exc
    except PDFEncryptionError as exc:
        raise ParseError(f"{ENCRYPTED_MESSAGE}, or uses an unsupported encryption method ({exc})") from exc
    except (PSException, ValueError, KeyError, TypeError, AssertionError, EOFError) as exc:
        if budget.exceeded:
            raise stream_too_large(budget.limit) from exc
        # pdfminer 遇到损坏的文件时抛出的异常并不都继承自 PSException
        raise ParseError(f"The PDF is damaged or could not be read: {type(exc).__name__}: {exc}") from exc
    finally:
        renderer.close()
    if budget.exceeded:
        # 超限的异常被 pdfminer 内部吞掉了（该流被当作空流）：照样按超限失败，不返回残缺的结果
        raise stream_too_large(budget.limit)
    return segments
