"""句子切分：识别句末标点，引号内的句末不切（见 docs/INVARIANTS.md 的 QUOTE-INTACT）。

句末标点：中文 ``。！？；…⋯`` 与半角句号 ``｡`` 总是句末；半角 ``! ? ;`` 在其后（跳过右引号/右括号）
是空白、文末或中日文字符时是句末；英文 ``.`` 只在其后是空白或文末时是句末（``3.14`` 不切），且前面不是
``ABBREVIATIONS`` 里的缩写（``e.g. the``、``et al. (2020)``、``Fig. 3`` 不切）。
句末标点后紧跟的右引号/右括号归入前一句。

引号：``“…”`` ``「…」`` ``『…』`` 与单弯引号（U+2018…U+2019）成对匹配（用栈，允许嵌套）；
ASCII ``"`` 在栈顶为 ``"`` 时闭合，否则开启；ASCII ``'`` 两侧都是 ASCII 字母数字时是撇号（don't）
而非引号，栈顶为 ``'`` 时闭合，前一个字符不是 ASCII 字母数字时开启。孤立的右引号（如用作撇号的右单弯引号）被忽略。
**引号不跨行**：遇到换行清空引号栈，未闭合的引号不会吞掉后文。
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import pairwise

from raglib.chunking._text import skip_space, trim_end
from raglib.chunking.markdown import LineKind, MarkdownLayout

__all__ = ["clause_end_positions", "sentence_end_positions", "sentence_spans", "split_sentences"]

_CJK = "\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef"
_CLOSERS = "”\u2019」』）)\\]】》〉\"'"
# 后面跟着的几乎总是同一句的缩写（不分大小写）：论文与百科里最常见的几种。etc.、Inc.、U.S.、单个字母的人名缩写
# 常常就在句末，不在此列——把句末当成句中，比把句中当成句末代价大（两句并成一句，分块与邻近程度都看不出边界）；
# Ms. 也不在：技术文档里“12 ms.”（毫秒）常在句末
ABBREVIATIONS = ("e.g", "i.e", "et al", "cf", "vs", "fig", "figs", "eq", "eqs", "ref", "refs", "sec", "approx",
                 "mr", "mrs", "dr", "prof", "st", "mt")
_NOT_ABBREVIATION = "".join(rf"(?<!\b(?i:{re.escape(abbreviation)}))" for abbreviation in ABBREVIATIONS)
# 开头的前瞻先排除不是标点的位置：每个字符都要试一遍，少试几个分支的代价是整个正则快一倍
SENTENCE_END_RE = re.compile(
    rf"(?=[。｡！？；…⋯.!?;])(?:[。｡！？；…⋯]+|(?:(?=[!?;])|(?=\.){_NOT_ABBREVIATION})[.!?;]+(?=[{_CLOSERS}]*(?:\s|$))|[!?;]+(?=[{_CJK}]))"
    rf"[{_CLOSERS}]*"
)
CLAUSE_END_RE = re.compile(rf"(?:[，、､﹐﹑]|,(?=\s|[{_CJK}]))")
_QUOTE_RE = re.compile("[“”「」『』\u2018\u2019\"'\n]")
_PAIRS = {"“": "”", "「": "」", "『": "』", "\u2018": "\u2019"}
_CLOSING = frozenset(_PAIRS.values())


def _ascii_alnum(char: str) -> bool:
    return char.isascii() and char.isalnum()


def _apply_quote(stack: list[str], text: str, pos: int, char: str) -> None:
    """按上面的规则更新引号栈。"""
    if char == "\n":
        stack.clear()
    elif char in _PAIRS:
        stack.append(_PAIRS[char])
    elif char in _CLOSING:
        if char in stack:
            # 闭合到匹配的那一层（容忍内层未闭合）
            while stack and stack.pop() != char:
                pass
    elif char == '"':
        if stack and stack[-1] == '"':
            stack.pop()
        else:
            stack.append('"')
    else:  # ASCII 单引号
        before = text[pos - 1] if pos > 0 else " "
        after = text[pos + 1] if pos + 1 < len(text) else " "
        if _ascii_alnum(before) and _ascii_alnum(after):
            return
        if stack and stack[-1] == "'":
            stack.pop()
        elif not _ascii_alnum(before):
            stack.append("'")


def sentence_end_positions(text: str) -> tuple[list[int], list[int]]:
    """所有句末位置（句末标点及其后右引号之后的下标），分为 (引号外, 引号内) 两组，各自升序。"""
    quotes = [(m.start(), m.group()) for m in _QUOTE_RE.finditer(text)]
    stack: list[str] = []
    outside: list[int] = []
    inside: list[int] = []
    next_quote = 0
    for match in SENTENCE_END_RE.finditer(text):
        while next_quote < len(quotes) and quotes[next_quote][0] < match.start():
            pos, char = quotes[next_quote]
            _apply_quote(stack, text, pos, char)
            next_quote += 1
        (inside if stack else outside).append(match.end())
    return outside, inside


def clause_end_positions(text: str) -> list[int]:
    """子句标点（，、,）之后的位置，升序。"""
    return [m.end() for m in CLAUSE_END_RE.finditer(text)]


def sentence_spans(text: str, layout: MarkdownLayout | None = None) -> list[tuple[int, int]]:
    """把 Markdown 切成句子，返回去掉首尾空白后的 ``(start, end)``，按位置升序、互不重叠。

    切点 = 引号外的句末，加上行结构切点：
    - 空行分段；标题行、列表项、表格行（对齐行并入表头行）、分隔线前后都切开；
    - 普通文本行之间的单个换行**不**切（PDF 转出的文本常在句中硬换行）；
    - 围栏代码块整体作为一个单元，表格行、标题行内部不按标点切。
    所有非空白字符恰好落在一个句子里。
    """
    if not text.strip():
        return []
    layout = layout or MarkdownLayout.parse(text)
    protected = layout.protected_spans()
    p_starts = [lead for lead, _ in protected]
    code_starts = [start for start, _ in layout.code_blocks]
    cuts = set(_line_cuts(layout))
    outside, _ = sentence_end_positions(text)
    for pos in outside:
        index = bisect_right(p_starts, pos) - 1
        if index >= 0 and p_starts[index] < pos < protected[index][1]:
            continue
        block = bisect_right(code_starts, pos) - 1
        if block >= 0 and code_starts[block] < pos < layout.code_blocks[block][1]:
            continue
        cuts.add(pos)
    cuts.update((0, len(text)))
    ordered = sorted(cuts)
    spans = []
    for left, right in pairwise(ordered):
        start = skip_space(text, left, right)
        end = trim_end(text, start, right)
        if end > start:
            spans.append((start, end))
    return spans


def split_sentences(text: str) -> list[str]:
    """:func:`sentence_spans` 的文本版。"""
    return [text[start:end] for start, end in sentence_spans(text)]


def _line_cuts(layout: MarkdownLayout) -> list[int]:
    """行结构决定的句子切点（行首偏移）。"""
    cuts: list[int] = []
    previous: LineKind | None = None  # 上一个非空行的类型
    blank_before = False
    in_code = False
    for line in layout.lines:
        kind = line.kind
        if kind is LineKind.BLANK:
            blank_before = True
            continue
        if in_code:
            # 代码块内部不切；闭合围栏结束代码块
            if kind is LineKind.FENCE:
                in_code = False
            previous = kind
            blank_before = False
            continue
        if kind is LineKind.FENCE:
            in_code = True
            cut = True
        elif kind in (LineKind.SETEXT_UNDERLINE, LineKind.TABLE_DELIMITER, LineKind.HR):
            cut = blank_before
        elif kind is LineKind.SETEXT_TEXT:
            cut = blank_before or previous is not LineKind.SETEXT_TEXT
        elif kind in (LineKind.ATX_HEADING, LineKind.TABLE, LineKind.LIST):
            cut = True
        else:  # 普通文本：只在空行后、或前一行是结构行时切
            cut = blank_before or previous not in (None, LineKind.TEXT, LineKind.LIST)
        if cut:
            cuts.append(line.start)
        previous = kind
        blank_before = False
    return cuts

