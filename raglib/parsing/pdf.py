"""PDF：pdfminer 逐页取文字层，每页一个片段（page 从 1 开始）；需要时用 pypdfium2 渲染后 OCR。

文字层的折行按版面接回去：行尾离栏的右沿不到“下一行第一个词加一个空格”那么宽、下一行又不缩进，说明是排版软件
放不下才折的行（软换行），不是作者的换行。中文在词中间折行，不接回去的话跨行的字 bigram 丢掉、短语与精确查询跨行
就找不到，答案被换行劈开。两种版面：
- 一个文字框（pdfminer 的 LTTextBox，一栏里行距紧的一片行）里的行（``_box_text``）；
- 行距大的排版（标书、公文常用 1.5 倍行距、28 磅固定行距）里 pdfminer 让每一行自成一框：下一个框紧挨在下面
  （空白不超过本页的行间空白）、左沿对齐、上一行是放不下才折的，就是同一段的下一行（``_continues``）。
英文行末断词的连字符（“retriev-”“al”）按整篇文档的用词定夺（``_resolve_hyphens``）；两端对齐拉开的多个空格压成一个。
作者的换行（短行：标题、列表项、段落的最后一行）照旧是换行，段落（文字框）之间照旧是空行。

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
import itertools
import re
import statistics
import unicodedata
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
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

# 文字框至少有这么多行高那么宽才按软换行接行：窄框（表格的一列、几行短字）的宽度就是它自己的最长行定的，
# 分不出“放不下才折”与“本来就是一行一项”
MIN_UNWRAP_BOX_LINE_HEIGHTS = 12.0

_CID = re.compile(r"\(cid:\d+\)")
_FIRST_WORD = re.compile(r"\S+")
_SPACES = re.compile(r"(?<=\S) {2,}(?=\S)")
# 行末断词：一个不带连字符的词 + 连字符结尾（“state-of-the-”是复合词，连字符保留）
_BROKEN_WORD = re.compile(r"(?:^|[^\w-])[^\W\d_]+-$")
# 行末“词-”接下一行小写开头的词：是断词（con-firming）还是复合词（chat-optimized）要看整篇文档的用词，
# 接行时先用这个私用区字符占住连字符的位置，整篇解析完由 ``_resolve_hyphens`` 定夺
_HYPHEN_MARK = "\ue000"
_MARKED_WORD = re.compile(rf"([^\W\d_]+){_HYPHEN_MARK}([^\W\d_]+)")
_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")
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
    from pdfminer.layout import LTContainer, LTImage, LTText, LTTextBox, LTTextBoxHorizontal

    parts: list[str] = []
    images: list[_Box] = []
    page_x0, page_y0, page_x1, page_y1 = layout.bbox
    # 每个横排文字框的行只取一次文字（get_text 逐字拼，按框算的几处都要用）
    box_lines = {id(box): _text_lines(box) for box in layout if isinstance(box, LTTextBoxHorizontal)}
    line_gap = _line_gap([box_lines[id(box)] for box in layout if id(box) in box_lines])
    # 上一个输出了文字的横排文字框：下一个框若只是同一段的下一行（行距大的排版里 pdfminer 让每行自成一框），接上去
    previous: list[tuple[Any, list[tuple[Any, str]]]] = []

    def render(item: Any) -> None:
        if isinstance(item, LTTextBoxHorizontal):
            lines = box_lines.get(id(item)) or _text_lines(item)
            text = _box_text(item, lines)
            if text and previous and parts[-1] == "\n" and _continues(*previous[0], item, lines, line_gap):
                parts.pop()
                parts[-1] = _join(parts[-1].rstrip("\n"), text)
            elif text:
                parts.append(text)
            if text:
                previous[:] = [(item, lines)]
        elif isinstance(item, LTContainer):
            previous.clear()
            for child in item:
                render(child)
        elif isinstance(item, LTText):
            previous.clear()
            parts.append(item.get_text())
        if isinstance(item, LTTextBox):
            parts.append("\n")
        elif isinstance(item, LTImage):
            previous.clear()
            x0, y0 = max(item.x0, page_x0), max(item.y0, page_y0)
            x1, y1 = min(item.x1, page_x1), min(item.y1, page_y1)
            src_w, src_h = (item.srcsize or (0, 0))
            if (x1 - x0 >= MIN_IMAGE_POINTS and y1 - y0 >= MIN_IMAGE_POINTS
                    and (src_w or 0) >= MIN_IMAGE_PIXELS and (src_h or 0) >= MIN_IMAGE_PIXELS):
                images.append(_Box(x0, y0, x1, y1))

    render(layout)
    return _PageContent(text=tidy(_CID.sub("", "".join(parts))), images=_distinct(images),
                        width=page_x1 - page_x0, height=page_y1 - page_y0)


def _text_lines(box: Any) -> list[tuple[Any, str]]:
    """框里有字的行与各自的文字（去掉行尾空白；两端对齐拉开的词距在文字层里是几个空格，压成一个）。"""
    lines = [(line, _SPACES.sub(" ", line.get_text().rstrip())) for line in box]
    return [(line, raw) for line, raw in lines if raw.strip()]


def _line_gap(boxes: list[list[tuple[Any, str]]]) -> float | None:
    """这一页正文的行间空白（pt）：框内相邻两行、以及上下紧挨着的相邻两个框之间空白的中位数；没有时为 None。
    ``boxes`` 是页面上各个横排文字框的行（``_text_lines``），按版面顺序。"""
    gaps: list[float] = []
    previous: Any = None
    for box in boxes:
        lines = [line for line, _ in box]
        gaps.extend(upper.y0 - lower.y1 for upper, lower in itertools.pairwise(lines))
        if previous is not None and lines and previous.y0 >= lines[0].y1 - 0.5:
            gaps.append(previous.y0 - lines[0].y1)
        previous = lines[-1] if lines else previous
    gaps = [gap for gap in gaps if gap >= 0]
    return statistics.median_low(gaps) if gaps else None


def _continues(upper: Any, upper_lines: list[tuple[Any, str]], lower: Any, lower_lines: list[tuple[Any, str]],
               line_gap: float | None) -> bool:
    """下一个文字框 ``lower`` 是不是 ``upper`` 那一段的下一行：紧挨在下面（空白不超过本页的行间空白，
    也不超过一个行高的 1.2 倍——再大就是段距），左沿不比上一框靠左，且上一行是放不下才折的（``_soft_break``，
    它也排除缩进的新段落）。右沿取两框中靠右的那个：一行一框时，框的右沿就是那一行自己的行尾。"""
    if line_gap is None or not upper_lines or not lower_lines:
        return False
    (last, _), (first, raw) = upper_lines[-1], lower_lines[0]
    gap = last.y0 - first.y1
    if not -0.5 <= gap <= min(1.15 * line_gap + 0.5, 1.2 * max(last.height, first.height)):
        return False
    margin = statistics.median_low(line.x0 for line, _ in upper_lines)
    if first.x0 < margin - 1.5 * first.width / max(len(raw), 1):
        return False
    return _soft_break(last, first, min(upper.x0, lower.x0), max(upper.x1, lower.x1), margin, raw)


def _wide(char: str) -> bool:
    """全角的字（汉字、假名、谚文、全角标点）：它们之间的换行接回去时不加空格。"""
    return unicodedata.east_asian_width(char) in ("W", "F")


def _soft_break(line: Any, following: Any, left: float, right: float, margin: float, following_raw: str) -> bool:
    """``line`` 之后的换行是不是排版折行：栏宽（``left`` 到 ``right``）不窄，行尾到右沿放不下下一行的第一个词
    （加一个空格），且下一行不缩进——比这个框多数行的左沿（``margin``）靠右，或者以空白（中文的全角空格）开头，
    都是新段落的首行；列表的悬挂缩进里多数行本来就缩进，不算。"""
    if right - left < MIN_UNWRAP_BOX_LINE_HEIGHTS * line.height:
        return False
    text = following_raw.strip()
    char_width = following.width / max(len(following_raw.rstrip()), 1)
    first = _FIRST_WORD.match(text)
    word_chars = 1 if _wide(text[0]) else len(first.group(0)) if first else 1
    fits = right - line.x1 >= (word_chars + 1) * char_width
    indented = following_raw[0].isspace() or following.x0 - margin > 1.5 * char_width
    return not fits and not indented


def _join(left: str, right: str) -> str:
    """接回一处软换行：全角字两边不加空格；行末连字符接住的词不加空格（软连字符去掉，可能是断词的先做记号，
    见 ``_HYPHEN_MARK``）；其余加一个空格。"""
    if left[-1] in "-\u00ad" and left[:-1][-1:].isalpha() and right[0].isalpha():
        if left[-1] == "\u00ad":
            return left[:-1] + right
        broken = _BROKEN_WORD.search(left) is not None and right[0].islower()
        return (left[:-1] + _HYPHEN_MARK if broken else left) + right
    if _wide(left[-1]) or _wide(right[0]):
        return left + right
    return f"{left} {right}"


def _resolve_hyphens(texts: list[str]) -> list[str]:
    """定夺行末连字符（``_HYPHEN_MARK``）：整篇文档别处用过连写的词就连写，用过带连字符的写法、或者两半各自都是
    文档里别处出现过的词（三个字母以上）就保留连字符，都没有时按断词连写——排版软件断词比复合词恰好落在行末常见得多。"""
    if not any(_HYPHEN_MARK in text for text in texts):
        return texts
    words: set[str] = set()
    for text in texts:
        for match in _WORD.finditer(_MARKED_WORD.sub(" ", text)):
            word = match.group(0).lower()
            words.add(word)
            words.update(word.split("-"))

    def resolve(match: re.Match[str]) -> str:
        left, right = match.group(1), match.group(2)
        if (left + right).lower() in words:
            return left + right
        if (f"{left}-{right}".lower() in words
                or (len(left) >= 3 and len(right) >= 3 and left.lower() in words and right.lower() in words)):
            return f"{left}-{right}"
        return left + right

    return [_MARKED_WORD.sub(resolve, text) for text in texts]


def _box_text(box: Any, lines: list[tuple[Any, str]]) -> str:
    """一个文字框的文字：软换行接回去（见模块说明），作者的换行保留；与 ``get_text`` 一样以换行结尾。"""
    if not lines:
        return ""
    margin = statistics.median_low(line.x0 for line, _ in lines)
    out = lines[0][1].strip()
    for (line, _), (following, raw) in itertools.pairwise(lines):
        text = raw.strip()
        out = _join(out, text) if _soft_break(line, following, box.x0, box.x1, margin, raw) else f"{out}\n{text}"
    return out + "\n"


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
    texts = _resolve_hyphens([segment.text for segment in segments])
    return [replace(segment, text=text) for segment, text in zip(segments, texts, strict=True)]
