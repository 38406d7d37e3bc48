"""按 token 数分块（默认策略 ``token``，也是 parent_child 与 semantic 强制切分的底层）。

整篇文档只编码一次，拿到每个 token 的字符偏移；切分点的选择全部在偏移数组上二分完成，
最后对每个候选块单独编码一次核对真实 token 数（单独编码可能比"落在区间内的 token 数"多 1 个
开头的 "▁"，见 tokenizer 模块说明），超了就收紧预算重选。总体 O(n log n)，无 O(n²) 的重复编码。

切分点优先级（数值越小越优先）::

    0 HEADING    标题行之前
    1 PARAGRAPH  空行分段之后
    2 LINE       换行之后（不在标题与其正文之间、Setext 下划线前、表格对齐行前切）
    3 SENTENCE   引号外的句末（。！？；… 等，见 sentences 模块）
    4 CLAUSE     子句标点（，、,）之后；引号内的句末也降到这一级
    5 TOKEN      任意 token 边界（不切开组合字符 / ZWJ 序列）

选择规则：窗口 = 从块起点起最多 ``budget`` 个 token（切分点必须在新内容之后）。窗口内有标题就在
最靠后的标题前切（块不跨进下一节，哪怕因此偏小；连续几个标题时切在这一串之前）；否则先在窗口后半段（至少填满一半）按优先级找
最靠后的 1-4 级切分点，后半段没有时再在整个窗口里找；仍没有才退到 token 边界。
表格行、代码行、标题行内部的 3/4/5 级切分点只在别无选择时使用（"不切开表格行"）。

重叠（``overlap`` > 0）的精确定义：设上一块为 ``[s, e)``、其后的切分点为 ``b``：

- 若 ``b`` 是标题切分点（0 级），下一块从 ``b`` 开始，不重叠；
- 否则下一块从 ``o`` 开始，``o`` 是 ``(s, e)`` 内满足 ``count(text[o:e]) <= overlap`` 的
  **最早**候选起点，候选依次取：句子级起点（0-3 级）→ 子句起点 → token 边界（不在受保护行内）
  → 受保护行内的切分点 → 任意 token 边界；且 ``o`` 不早于块内最后一个标题（重叠不跨标题）；
- 找不到任何满足条件的 ``o`` 时退化为从 ``b`` 开始（不重叠）。

因此：相邻块要么重叠区 ``text[o:e]`` 的 token 数 ≤ overlap，要么二者之间只隔空白；
每块的起点严格递增、终点严格递增；所有非空白字符都被覆盖。
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Final

import numpy as np

from raglib.chunking._text import is_char_boundary, next_char_boundary, skip_space, trim_end
from raglib.chunking.markdown import LineKind, MarkdownLayout
from raglib.chunking.sentences import clause_end_positions, sentence_end_positions
from raglib.chunking.tokenizer import Tokenizer

__all__ = ["CLAUSE", "END", "HEADING", "LINE", "PARAGRAPH", "SENTENCE", "TOKEN", "BreakIndex", "Piece", "TokenChunker"]

HEADING: Final = 0
PARAGRAPH: Final = 1
LINE: Final = 2
SENTENCE: Final = 3
CLAUSE: Final = 4
TOKEN: Final = 5
END: Final = 6  # 到达区间末尾

# 重叠起点每类候选最多核对的次数（每次核对是一次小文本编码）
_MAX_OVERLAP_PROBES: Final = 16


@dataclass(frozen=True, slots=True)
class Piece:
    """一个块的区间（已去掉首尾空白）、真实 token 数，以及它结尾处切分点的级别。"""

    start: int
    end: int
    token_count: int
    level: int


def _latest(positions: list[int], lo: int, hi: int) -> int | None:
    """``positions`` 中满足 ``lo < p <= hi`` 的最大值。"""
    index = bisect_right(positions, hi) - 1
    if index >= 0 and positions[index] > lo:
        return positions[index]
    return None


class BreakIndex:
    """各级切分点（均已归一到其后第一个非空白字符），以及受保护行。"""

    def __init__(self, text: str, layout: MarkdownLayout) -> None:
        self.text = text
        protected = layout.protected_spans()
        self._p_leads = [lead for lead, _ in protected]
        self._p_ends = [end for _, end in protected]
        length = len(text)

        heading = list(layout.heading_positions)
        paragraph: list[int] = []
        line_starts: list[int] = []
        after_heading: set[int] = set()
        # 连续标题（中间只有空行）的第一个标题位置：在一串标题前切，而不是切在串中间留下空标题
        self.heading_run_start: dict[int, int] = {}
        heading_set = set(heading)
        run_start = -1
        previous: LineKind | None = None
        blank = False
        for line in layout.lines:
            kind = line.kind
            if kind is LineKind.BLANK:
                blank = True
                continue
            if line.lead in heading_set:
                if previous not in (LineKind.ATX_HEADING, LineKind.SETEXT_UNDERLINE):
                    run_start = line.lead
                self.heading_run_start[line.lead] = run_start
            if previous in (LineKind.ATX_HEADING, LineKind.SETEXT_UNDERLINE):
                # 标题与其后正文之间不切，免得标题孤零零挂在上一块末尾
                after_heading.add(line.lead)
            elif kind in (LineKind.SETEXT_UNDERLINE, LineKind.TABLE_DELIMITER) or (
                kind is LineKind.SETEXT_TEXT and previous is LineKind.SETEXT_TEXT and not blank
            ):
                pass
            else:
                line_starts.append(line.lead)
                if blank:
                    paragraph.append(line.lead)
            previous = kind
            blank = False

        sentence: list[int] = []
        clause: list[int] = []
        relaxed: list[int] = []
        outside, inside = sentence_end_positions(text)
        for positions, target in ((outside, sentence), (inside, clause), (clause_end_positions(text), clause)):
            for raw in positions:
                pos = skip_space(text, raw)
                if pos >= length or pos in after_heading:
                    continue
                (relaxed if self.is_protected(pos) else target).append(pos)

        self.heading = heading
        self.levels: list[list[int]] = [
            heading,
            sorted(set(paragraph)),
            sorted(set(line_starts)),
            sorted(set(sentence)),
            sorted(set(clause)),
        ]
        self.relaxed = sorted(set(relaxed))
        self.sentence_starts = sorted(set(heading) | set(paragraph) | set(line_starts) | set(sentence))

    def is_protected(self, pos: int) -> bool:
        """``pos`` 是否落在表格行/代码行/标题行内部（行首不算）。"""
        index = bisect_right(self._p_leads, pos) - 1
        return index >= 0 and self._p_leads[index] < pos < self._p_ends[index]


class TokenChunker:
    """对一篇文档（可多次、对不同子区间）做 token 分块；构造时编码整篇文档一次。"""

    def __init__(self, text: str, tokenizer: Tokenizer, layout: MarkdownLayout | None = None) -> None:
        self.text = text
        self.tokenizer = tokenizer
        self.layout = layout or MarkdownLayout.parse(text)
        self.breaks = BreakIndex(text, self.layout)
        # 整篇的 token 偏移只以两列 int64 数组保存（约 16 字节/token），按窗口编码得到：
        # 一次编码整篇 30 MB 文本，tokenizers 的 Encoding 与 Python 元组列表要占几个 GB
        offsets = tokenizer.offsets_array(text)
        # 偏移理论上单调；取前缀最大值保证二分的前提成立
        self.starts = np.maximum.accumulate(offsets[:, 0]) if len(offsets) else offsets[:, 0]
        self.ends = np.maximum.accumulate(offsets[:, 1]) if len(offsets) else offsets[:, 1]

    def approx_count(self, start: int, end: int) -> int:
        """按整篇编码估计 ``[start, end)`` 的 token 数（与区间相交的 token 都算上）。"""
        return int(np.searchsorted(self.starts, end, "left")) - int(np.searchsorted(self.ends, start, "right"))

    def chunk(self, lo: int, hi: int, size: int, overlap: int) -> list[Piece]:
        """把 ``text[lo:hi]`` 切成每块 ≤ ``size`` token、相邻重叠 ≤ ``overlap`` token 的块。

        唯一可能超过 ``size`` 的情形：单个不可再分的字符本身就编码成超过 ``size`` 个 token
        （只在 ``size`` 极小时出现，如 ``size=1`` 时的任何汉字：``count("中") == 2``）。
        """
        text = self.text
        pieces: list[Piece] = []
        start = skip_space(text, lo, hi)
        covered = start  # 已输出内容的右端
        while True:
            fresh = skip_space(text, covered, hi)  # 第一个尚未输出的非空白字符
            if fresh >= hi:
                break
            piece, boundary = self._next_piece(start, fresh, hi, size)
            pieces.append(piece)
            if boundary >= hi:
                break
            covered = piece.end
            if overlap > 0 and piece.level != HEADING:
                start = self._overlap_start(piece.start, piece.end, boundary, overlap)
            else:
                start = boundary
        return pieces

    def _next_piece(self, start: int, fresh: int, hi: int, size: int) -> tuple[Piece, int]:
        """从 ``start`` 起取一块，且必须包含 ``fresh`` 处的新内容；返回块和其后的切分点。"""
        text = self.text
        budget = size
        while True:
            choice = self._choose(start, fresh, hi, budget) if budget > 0 else None
            if choice is None:
                if start < fresh:
                    # 重叠部分挤占了全部预算：放弃重叠再试
                    start, budget = fresh, size
                    continue
                end = next_char_boundary(text, fresh, hi)
                piece = Piece(fresh, end, self.tokenizer.count(text[fresh:end]), TOKEN)
                return piece, skip_space(text, end, hi)
            boundary, level = choice
            end = trim_end(text, start, boundary)
            count = self.tokenizer.count(text[start:end])
            if count <= size:
                return Piece(start, end, count, level), boundary
            budget -= max(1, count - size)

    def _choose(self, start: int, fresh: int, hi: int, budget: int) -> tuple[int, int] | None:
        """在 token 预算内选切分点 ``b``（``fresh < b``），返回 ``(b, 级别)``。"""
        # 单独编码时开头通常多一个 "▁"（见 tokenizer 模块），估计时预留 1 个 token，减少重选
        budget -= 1
        if self.approx_count(start, hi) <= budget:
            return hi, END
        first = int(np.searchsorted(self.ends, start, "right"))
        limit = first + budget
        max_end = min(int(self.starts[limit]), hi) if limit < len(self.starts) else hi
        if max_end <= fresh:
            return None
        half = first + budget // 2
        fill = min(int(self.starts[half]), hi) if half < len(self.starts) else hi
        # 标题在整个窗口内都优先（哪怕块因此偏小），保证块不跨进下一节、heading_path 准确
        found = _latest(self.breaks.levels[HEADING], fresh, max_end)
        if found is not None:
            run_start = self.breaks.heading_run_start.get(found, found)
            if run_start > fresh:
                return run_start, HEADING
            # 块本身就从这串标题开始：串内不切，让标题带上后面的正文

        lows = (max(fill, fresh), fresh) if fill > fresh else (fresh,)
        for low in lows:
            for level in range(PARAGRAPH, TOKEN):
                found = _latest(self.breaks.levels[level], low, max_end)
                if found is not None:
                    return found, level
        found = self._latest_token(fresh, max_end, hi, strict=True)
        if found is None:
            found = _latest(self.breaks.relaxed, fresh, max_end)
        if found is None:
            found = self._latest_token(fresh, max_end, hi, strict=False)
        return None if found is None else (found, TOKEN)

    def _latest_token(self, low: int, max_end: int, hi: int, *, strict: bool) -> int | None:
        """``(low, max_end]`` 内最靠后的 token 边界（归一到非空白字符）。"""
        index = int(np.searchsorted(self.starts, max_end, "right")) - 1
        while index >= 0 and self.starts[index] > low:
            pos = skip_space(self.text, int(self.starts[index]), hi)
            if (
                low < pos <= max_end
                and is_char_boundary(self.text, pos)
                and not (strict and self.breaks.is_protected(pos))
            ):
                return pos
            index -= 1
        return None

    def _overlap_start(self, start: int, end: int, boundary: int, overlap: int) -> int:
        """下一块的起点（定义见模块说明）。"""
        tokens_before_end = int(np.searchsorted(self.starts, end, "left"))
        # 估计的最早起点再往前放宽一个 token，由真实编码核对
        index = tokens_before_end - overlap - 2
        low = max(start + 1, int(self.ends[index]) if index >= 0 else 0)
        last_heading = _latest(self.breaks.heading, start, end - 1)
        if last_heading is not None:
            low = max(low, last_heading)
        breaks = self.breaks
        for candidates in (breaks.sentence_starts, breaks.levels[CLAUSE]):
            found = self._first_fitting(self._from_list(candidates, low, end), end, overlap)
            if found is not None:
                return found
        for strict in (True, False):
            found = self._first_fitting(self._from_tokens(low, end, strict=strict), end, overlap)
            if found is not None:
                return found
            if strict:
                found = self._first_fitting(self._from_list(breaks.relaxed, low, end), end, overlap)
                if found is not None:
                    return found
        return boundary

    def _first_fitting(self, candidates: list[int], end: int, overlap: int) -> int | None:
        for pos in candidates[:_MAX_OVERLAP_PROBES]:
            if self.tokenizer.count(self.text[pos:end]) <= overlap:
                return pos
        return None

    @staticmethod
    def _from_list(positions: list[int], low: int, end: int) -> list[int]:
        index = bisect_left(positions, low)
        return [pos for pos in positions[index : index + _MAX_OVERLAP_PROBES] if pos < end]

    def _from_tokens(self, low: int, end: int, *, strict: bool) -> list[int]:
        found: list[int] = []
        index = int(np.searchsorted(self.starts, low, "left"))
        while index < len(self.starts) and self.starts[index] < end and len(found) < _MAX_OVERLAP_PROBES:
            pos = skip_space(self.text, int(self.starts[index]), end)
            index += 1
            if pos < low or pos >= end or (found and pos <= found[-1]):
                continue
            if is_char_boundary(self.text, pos) and not (strict and self.breaks.is_protected(pos)):
                found.append(pos)
        return found
