"""纯文本类格式：TXT、Markdown、HTML 的解码与转换，以及各格式共用的文本整理。

中文优先的编码判定：BOM → 严格 UTF-8 → charset-normalizer 候选 + GB18030/Big5 “常用字比例”裁决。
短小的中文样本（十几个字）对统计类检测器是歧义的：GBK 字节按 Big5 也能解出一串生僻字，
所以对 GB18030 与 Big5 两种解读各算一次“常用汉字占比”，取明显更像中文的那个。
"""

from __future__ import annotations

# charset_normalizer、BeautifulSoup、markitdown 在函数里导入：较重，只有解析对应格式时才加载。
import codecs
import re
from pathlib import Path
from typing import Any

import structlog

from raglib.parsing.base import Segment
from raglib.parsing.ocr_session import OcrSession

# 用于判定编码的样本长度：足够统计，又不必把大文件逐字扫描
_SAMPLE_BYTES = 64 * 1024
# 中文候选要被采用，常用字占比至少要到这个值
_CHINESE_MIN_RATIO = 0.6
# 中文候选的混乱度最多比检测器的最佳候选高这么多
_CHAOS_TOLERANCE = 0.05

_BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\xef\xbb\xbf", "utf-8-sig"),
    # utf-16 / utf-32 编解码器自己识别并去掉 BOM
    (b"\xff\xfe\x00\x00", "utf-32"),
    (b"\x00\x00\xfe\xff", "utf-32"),
    (b"\xff\xfe", "utf-16"),
    (b"\xfe\xff", "utf-16"),
)

# 归入 GB18030 的编码名（GB18030 是 GB2312/GBK 的超集，用它解码不会丢字）
_GB_FAMILY = frozenset({"gb2312", "gbk", "gb18030", "hz", "euc_cn", "cp936", "ms936"})
_BIG5_FAMILY = frozenset({"big5", "big5hkscs", "cp950"})

# 中文排版常用的标点：弯引号、破折号、省略号、间隔号（CJK 标点区与全角区按码位范围判断）
_CJK_PUNCTUATION = frozenset(chr(code) for code in (0x00B7, 0x2014, 0x2018, 0x2019, 0x201C, 0x201D, 0x2026))

logger = structlog.get_logger(__name__)

_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_MANY_BLANK_LINES = re.compile(r"\n{3,}")
_TRAILING_SPACE = re.compile(r"[ \t\u3000]+\n")
_MARKDOWN_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_\-]+)""", re.IGNORECASE)


def tidy(text: str) -> str:
    """统一换行、不换行空格变普通空格、去掉控制字符与行尾空白、把连续空行压成一行空行。"""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x0c", "\n\n").replace("\xa0", " ")
    text = _CONTROL_CHARS.sub("", text.lstrip("\ufeff"))
    text = _TRAILING_SPACE.sub("\n", text + "\n")
    return _MANY_BLANK_LINES.sub("\n\n", text).strip()


def images_to_alt_text(markdown: str) -> str:
    """Markdown 图片 ``![alt](src)`` 换成 alt 文字：src 多是截断的 data URI 或包内文件名，对检索只有噪音。"""
    return _MARKDOWN_IMAGE.sub(lambda match: match.group(1).strip(), markdown)


def _is_common_hanzi(char: str) -> bool:
    """常用汉字：GB2312 一级字（简体）或 Big5 常用字区（繁体）。"""
    try:
        gb = char.encode("gb2312")
        if len(gb) == 2 and 0xB0 <= gb[0] <= 0xD7:
            return True
    except UnicodeEncodeError:
        pass
    try:
        big5 = char.encode("big5")
        return len(big5) == 2 and 0xA440 <= int.from_bytes(big5, "big") <= 0xC67E
    except UnicodeEncodeError:
        return False


def chinese_ratio(text: str) -> float:
    """非 ASCII 字符中“常用汉字或中文标点”的占比；没有非 ASCII 字符时为 0。"""
    non_ascii = [char for char in text if ord(char) > 0x7F]
    if not non_ascii:
        return 0.0
    good = sum(
        1 for char in non_ascii
        if char in _CJK_PUNCTUATION or 0x3000 <= ord(char) <= 0x303F or 0xFF01 <= ord(char) <= 0xFF5E
        or _is_common_hanzi(char)
    )
    return good / len(non_ascii)


def _decode_prefix(sample: bytes, encoding: str) -> str | None:
    """严格解码样本；样本末尾被截断的多字节字符不算错误。"""
    try:
        return codecs.getincrementaldecoder(encoding)(errors="strict").decode(sample, final=False)
    except (UnicodeDecodeError, LookupError):
        return None


def _normalize_encoding(name: str) -> str:
    name = codecs.lookup(name).name.replace("-", "_")
    if name in _GB_FAMILY:
        return "gb18030"
    if name in _BIG5_FAMILY:
        return "big5hkscs" if name == "big5hkscs" else "cp950"
    return name


def guess_encoding(data: bytes) -> str:
    """判定字节串的编码（返回 Python 编码名）。"""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return encoding
    sample = data[:_SAMPLE_BYTES]
    if _decode_prefix(sample, "utf-8") is not None:
        return "utf-8"

    from charset_normalizer import from_bytes

    matches = list(from_bytes(sample))
    if not matches:
        return "gb18030"
    best = min(matches, key=lambda match: match.chaos)
    # 检测器给出的各编码“混乱度”；中文候选的混乱度不能明显高于最佳者（否则多半是日文、韩文）
    chaos: dict[str, float] = {}
    for match in matches:
        name = _normalize_encoding(match.encoding)
        chaos[name] = min(chaos.get(name, 1.0), match.chaos)
    scored: list[tuple[float, str]] = []
    for encoding in ("gb18030", "cp950"):
        if encoding not in chaos or chaos[encoding] > best.chaos + _CHAOS_TOLERANCE:
            continue
        decoded = _decode_prefix(sample, encoding)
        if decoded is not None:
            scored.append((chinese_ratio(decoded), encoding))
    scored.sort(reverse=True)
    if scored and scored[0][0] >= _CHINESE_MIN_RATIO:
        return scored[0][1]
    detected = _normalize_encoding(best.encoding)
    # 西文单字节编码之间常常打平：优先最常见的 cp1252
    if detected.startswith(("cp125", "iso8859", "latin")) and chaos.get("cp1252", 1.0) <= best.chaos:
        return "cp1252"
    return detected


def decode_text(data: bytes) -> str:
    """把文本文件的字节解码为字符串（无法解码的字节用替换字符，不抛异常）。"""
    encoding = guess_encoding(data)
    return data.decode(encoding, errors="replace")


def decode_html(data: bytes) -> str:
    """HTML 解码：BOM → <meta charset> 声明（能严格解码才信）→ 与纯文本相同的判定。"""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data.decode(encoding, errors="replace")
    declared = _META_CHARSET.search(data[:8192])
    if declared:
        try:
            encoding = _normalize_encoding(declared.group(1).decode("ascii"))
            return data.decode(encoding)
        except (LookupError, UnicodeDecodeError):
            pass
    return decode_text(data)


def parse_txt(path: Path, session: OcrSession) -> list[Segment]:
    """TXT 与 Markdown：原样保留内容（Markdown 本身就是输出格式），只做解码和空白整理。"""
    decoded = decode_text(path.read_bytes())
    # 解码后立即计数：超限的文本不再经过 tidy 的几轮正则（每轮都复制一份全文）
    session.limits.check_chars(len(decoded))
    text = tidy(decoded)
    return [Segment(text=text)] if text else []


# class/id 中出现这些词的元素多是导航、菜单、目录、页脚等样板（拆分 - 与 _ 后整词匹配）
_BOILERPLATE_WORDS = frozenset({
    "nav", "navbar", "navigation", "navbox", "menu", "breadcrumb", "breadcrumbs", "sidebar", "footer",
    "dropdown", "toc", "cookie", "cookies", "banner", "skip", "share", "social",
})
_TOKEN_SPLIT = re.compile(r"[\s_\-]+")
# 单个样板元素的文字超过全文这个比例就不删（宁可留样板，也不能误删正文）
_BOILERPLATE_MAX_SHARE = 0.3


def _strip_boilerplate(soup: Any) -> None:
    """删去脚本、样式、表单控件与导航类样板；正文容器（body/main/article）和含一级标题的元素不删。"""
    for tag in soup(["script", "style", "noscript", "template", "svg", "nav", "input", "button", "select"]):
        tag.decompose()
    for tag in soup.select('[role="navigation"]'):
        tag.decompose()
    total = max(len(soup.get_text()), 1)
    for tag in soup.find_all(True):
        if tag.decomposed or tag.name in ("html", "body", "main", "article"):
            continue
        attrs = tag.attrs or {}
        classes = attrs.get("class") or []
        names = " ".join([*classes, str(attrs.get("id") or "")]).lower()
        if not names or not _BOILERPLATE_WORDS.intersection(_TOKEN_SPLIT.split(names)):
            continue
        if tag.find("h1") is not None or len(tag.get_text()) > total * _BOILERPLATE_MAX_SHARE:
            continue
        tag.decompose()


# 超过这个嵌套深度的 HTML 不再保留结构：bs4 与 markdownify 的耗时随深度超线性增长（实测 2000 层约 3 s，
# 十万层五分钟也转不完），真实网页很少超过一两百层
MAX_HTML_DEPTH = 400
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9]*)\b[^<>]*?(/?)>")
# 空元素与可省略结束标签的元素不计深度（<p>、<li> 不闭合的网页很常见，计入会误判）
_FLAT_TAGS = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr",
    "p", "li", "dt", "dd", "tr", "td", "th", "option", "optgroup", "thead", "tbody", "tfoot", "colgroup",
    "caption", "rt", "rp", "html", "head", "body",
})
_SCRIPT_OR_STYLE = re.compile(r"<(script|style)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)


def html_depth(html: str) -> int:
    """标签的最大嵌套深度（一遍线性扫描）。"""
    depth = deepest = 0
    for match in _TAG.finditer(html):
        if match.group(3) or match.group(2).lower() in _FLAT_TAGS:
            continue
        depth = max(depth - 1, 0) if match.group(1) else depth + 1
        deepest = max(deepest, depth)
    return deepest


def _flat_html_text(html: str) -> str:
    """去掉全部标签只留文字（线性）：嵌套过深的 HTML 用它代替结构化转换。"""
    import html as html_module

    return html_module.unescape(_TAG.sub("\n", _SCRIPT_OR_STYLE.sub("", html)))


def parse_html(path: Path, session: OcrSession) -> list[Segment]:
    """HTML：去掉导航等样板，优先只取唯一的 <main>，再用 markitdown 转 Markdown（保留标题、列表、表格）。

    嵌套超过 MAX_HTML_DEPTH 层的（畸形或恶意的）网页只取纯文字，保证时间线性。
    """
    decoded = decode_html(path.read_bytes())
    depth = html_depth(decoded)
    if depth > MAX_HTML_DEPTH:
        logger.warning("html_too_deep", depth=depth, limit=MAX_HTML_DEPTH)
        text = tidy(_flat_html_text(decoded))
        return [Segment(text=text)] if text else []

    from bs4 import BeautifulSoup
    from markitdown.converters import HtmlConverter

    soup = BeautifulSoup(decoded, "html.parser")
    title = soup.title.get_text().strip() if soup.title else ""
    _strip_boilerplate(soup)
    mains = soup.select('main, [role="main"]')
    html = str(mains[0]) if len(mains) == 1 else str(soup)
    markdown = HtmlConverter().convert_string(html).markdown
    markdown = tidy(images_to_alt_text(markdown))
    # 正文没有一级标题时把 <title> 补成标题，分块后每块都能带上文档名这个上下文
    if markdown and title and not re.search(r"^# ", markdown, re.MULTILINE):
        markdown = f"# {title}\n\n{markdown}"
    return [Segment(text=markdown)] if markdown else []
