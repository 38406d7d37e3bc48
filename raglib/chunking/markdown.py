"""Markdown 的行级结构识别：标题层级、围栏代码块、表格行、列表项、分隔线。

分块只需要知道"哪些行是什么"，所以这里不是完整的 CommonMark 解析器，约定如下：

- 行只按 ``\\n`` 切分（``\\r`` 视为行尾空白）；
- ATX 标题：行首至多 3 个空格 + 1~6 个 ``#`` + 空格或行尾；去掉结尾的 ``#`` 闭合序列；
  标题文字为空的 ``#`` 行只截断更深的层级，不进入路径；
- Setext 标题：紧跟在段落文本行之后的 ``===``/``---`` 行，标题文字是该段落（多行以空格连接），
  标题从段落第一行开始生效；段落前面紧挨着列表/表格时不算（按分隔线/普通文本处理）；
- 围栏代码块（```` ``` ```` / ``~~~``，闭合围栏须同字符且不短于开头）里的 ``#`` 行不是标题；
  未闭合的围栏延续到文末（与 CommonMark 一致）；
- 表格：含 ``|`` 的表头行 + 对齐行（``|---|:--:|``）开始一个表格块，后续含 ``|`` 的行属于该表；
  行首是 ``|`` 的行也视为表格行；
- 引用块 ``>`` 与缩进代码块按普通文本处理。
"""

from __future__ import annotations

import enum
import re
from bisect import bisect_right
from dataclasses import dataclass, field

from raglib.chunking._text import skip_space

__all__ = ["Line", "LineKind", "MarkdownLayout", "heading_path_at"]


class LineKind(enum.Enum):
    BLANK = "blank"
    TEXT = "text"
    ATX_HEADING = "atx_heading"
    SETEXT_TEXT = "setext_text"
    SETEXT_UNDERLINE = "setext_underline"
    FENCE = "fence"
    CODE = "code"
    TABLE = "table"
    TABLE_DELIMITER = "table_delimiter"
    LIST = "list"
    HR = "hr"


# 不能在行内切开的行（表格行、代码、标题）
PROTECTED_KINDS = frozenset(
    {
        LineKind.TABLE,
        LineKind.TABLE_DELIMITER,
        LineKind.CODE,
        LineKind.FENCE,
        LineKind.ATX_HEADING,
        LineKind.SETEXT_TEXT,
    }
)
HEADING_KINDS = frozenset({LineKind.ATX_HEADING, LineKind.SETEXT_TEXT, LineKind.SETEXT_UNDERLINE})

_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
_ATX_CLOSING = re.compile(r"(?:^|[ \t]+)#+$")
_FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})(.*)$")
_SETEXT_UNDERLINE = re.compile(r" {0,3}(=+|-+)[ \t]*$")
_HR = re.compile(r" {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_LIST_ITEM = re.compile(r"[ \t]*(?:[-*+]|\d{1,9}[.)])(?:[ \t]+|$)")
_TABLE_DELIMITER = re.compile(r"[ \t]*\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_TABLE_ROW_START = re.compile(r" {0,3}\|")


@dataclass(frozen=True, slots=True)
class Line:
    """一行：``start`` 行首偏移，``end`` 行内容结束（不含 ``\\n``，含 ``\\r``），``lead`` 第一个非空白字符。"""

    start: int
    end: int
    lead: int
    kind: LineKind


@dataclass
class MarkdownLayout:
    """整篇 Markdown 的行结构与标题事件；``parse`` 一次，供各分块策略共用。"""

    text: str
    lines: list[Line]
    # 标题事件：heading_positions[i] 处起生效的标题路径为 heading_paths[i]（位置为标题首行第一个非空白字符）
    heading_positions: list[int] = field(default_factory=list)
    heading_paths: list[tuple[str, ...]] = field(default_factory=list)
    # 围栏代码块的字符区间 [start, end)，含开闭围栏行
    code_blocks: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> MarkdownLayout:
        return _Parser(text).run()

    def heading_path_at(self, pos: int) -> tuple[str, ...]:
        """``pos`` 处生效的标题层级（标题从其首行第一个非空白字符起生效）。"""
        index = bisect_right(self.heading_positions, pos) - 1
        return self.heading_paths[index] if index >= 0 else ()

    def protected_spans(self) -> list[tuple[int, int]]:
        """不宜在行内切开的行（表格/代码/标题）的 ``(lead, end)``；位置 p 满足 lead < p < end 即在行内。"""
        return [(line.lead, line.end) for line in self.lines if line.kind in PROTECTED_KINDS]


def heading_path_at(markdown: str, pos: int) -> tuple[str, ...]:
    """便捷函数：解析 ``markdown`` 并返回 ``pos`` 处的标题层级（测试与一次性调用用）。"""
    return MarkdownLayout.parse(markdown).heading_path_at(pos)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.raw: list[tuple[int, int]] = []
        pos = 0
        length = len(text)
        while pos <= length:
            newline = text.find("\n", pos)
            end = length if newline < 0 else newline
            self.raw.append((pos, end))
            if newline < 0:
                break
            pos = newline + 1
        self.kinds: list[LineKind] = []
        self.titles: dict[int, tuple[int, str]] = {}  # 标题首行下标 -> (层级, 文字)

    def content(self, index: int) -> str:
        start, end = self.raw[index]
        return self.text[start:end].rstrip("\r")

    def run(self) -> MarkdownLayout:
        fence: tuple[str, int] | None = None
        fence_start = 0
        code_blocks: list[tuple[int, int]] = []
        in_table = False
        for index in range(len(self.raw)):
            line = self.content(index)
            if fence is not None:
                self.kinds.append(LineKind.FENCE if _closes_fence(line, fence) else LineKind.CODE)
                if self.kinds[-1] is LineKind.FENCE:
                    fence = None
                    code_blocks.append((fence_start, self.raw[index][1]))
                continue
            if not line.strip():
                self.kinds.append(LineKind.BLANK)
                in_table = False
                continue
            if in_table and "|" in line:
                self.kinds.append(LineKind.TABLE)
                continue
            in_table = False
            opening = _FENCE_OPEN.match(line)
            if opening and not (opening.group(1)[0] == "`" and "`" in opening.group(2)):
                fence = (opening.group(1)[0], len(opening.group(1)))
                fence_start = self.raw[index][0]
                self.kinds.append(LineKind.FENCE)
                continue
            atx = _ATX.match(line)
            if atx:
                title = _ATX_CLOSING.sub("", atx.group(2) or "").strip()
                self.titles[index] = (len(atx.group(1)), title)
                self.kinds.append(LineKind.ATX_HEADING)
                continue
            if _SETEXT_UNDERLINE.match(line) and self._setext(index, line):
                continue
            if _HR.match(line):
                self.kinds.append(LineKind.HR)
            elif "|" in line and self._next_is_delimiter(index):
                self.kinds.append(LineKind.TABLE)
                in_table = True
            elif _TABLE_ROW_START.match(line):
                kind = LineKind.TABLE_DELIMITER if _TABLE_DELIMITER.match(line) else LineKind.TABLE
                self.kinds.append(kind)
            elif _LIST_ITEM.match(line):
                self.kinds.append(LineKind.LIST)
            else:
                self.kinds.append(LineKind.TEXT)
        if fence is not None:
            code_blocks.append((fence_start, len(self.text)))
        self._mark_table_delimiters()
        return self._layout(code_blocks)

    def _setext(self, index: int, line: str) -> bool:
        """若 ``index`` 是 Setext 下划线则把上方段落改标为标题文字并返回 True。"""
        first = index
        while first > 0 and self.kinds[first - 1] is LineKind.TEXT:
            first -= 1
        if first == index:
            return False
        if first > 0 and self.kinds[first - 1] in (LineKind.LIST, LineKind.TABLE, LineKind.TABLE_DELIMITER):
            return False
        for row in range(first, index):
            self.kinds[row] = LineKind.SETEXT_TEXT
        title = " ".join(self.content(row).strip() for row in range(first, index))
        self.titles[first] = (1 if line.strip()[0] == "=" else 2, title)
        self.kinds.append(LineKind.SETEXT_UNDERLINE)
        return True

    def _next_is_delimiter(self, index: int) -> bool:
        if index + 1 >= len(self.raw):
            return False
        following = self.content(index + 1)
        return "|" in following and bool(_TABLE_DELIMITER.match(following))

    def _mark_table_delimiters(self) -> None:
        for index in range(1, len(self.kinds)):
            if (
                self.kinds[index] is LineKind.TABLE
                and self.kinds[index - 1] is LineKind.TABLE
                and _TABLE_DELIMITER.match(self.content(index))
                and (index < 2 or self.kinds[index - 2] is not LineKind.TABLE)
            ):
                self.kinds[index] = LineKind.TABLE_DELIMITER

    def _layout(self, code_blocks: list[tuple[int, int]]) -> MarkdownLayout:
        lines = []
        for (start, end), kind in zip(self.raw, self.kinds, strict=True):
            lead = skip_space(self.text, start, end) if kind is not LineKind.BLANK else end
            lines.append(Line(start, end, lead, kind))
        positions: list[int] = []
        paths: list[tuple[str, ...]] = []
        stack: list[tuple[int, str]] = []
        for index in sorted(self.titles):
            level, title = self.titles[index]
            while stack and stack[-1][0] >= level:
                stack.pop()
            if title:
                stack.append((level, title))
            positions.append(lines[index].lead)
            paths.append(tuple(name for _, name in stack))
        return MarkdownLayout(self.text, lines, positions, paths, code_blocks)


def _closes_fence(line: str, fence: tuple[str, int]) -> bool:
    stripped = line.strip()
    char, length = fence
    indent = len(line) - len(line.lstrip(" "))
    return indent <= 3 and len(stripped) >= length and stripped == char * len(stripped)
