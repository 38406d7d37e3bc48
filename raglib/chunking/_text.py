"""字符级小工具：跳过/裁掉空白、判断某个位置能否作为切分点。"""

from __future__ import annotations

import re
import unicodedata

_NON_SPACE = re.compile(r"\S")

_ZWJ = "\u200d"


def skip_space(text: str, pos: int, hi: int | None = None) -> int:
    """``pos`` 起第一个非空白字符的位置；没有则返回 ``hi``（默认文本末尾）。"""
    end = len(text) if hi is None else hi
    if pos >= end:
        return end
    if not text[pos].isspace():
        return pos
    match = _NON_SPACE.search(text, pos, end)
    return match.start() if match else end


def trim_end(text: str, lo: int, pos: int) -> int:
    """把区间右端 ``pos`` 向左收缩到最后一个非空白字符之后（不越过 ``lo``）。"""
    while pos > lo and text[pos - 1].isspace():
        pos -= 1
    return pos


def is_char_boundary(text: str, pos: int) -> bool:
    """``pos`` 处切开是否会破坏一个"字符"。

    Python 字符串按码点索引，本身不会切开 UTF-8 字节；这里进一步避免：
    切开代理对（只在含孤立代理项的字符串里出现）、把组合附加符号/变体选择符与基字分开、
    切开 ZWJ 连接的 emoji 序列。
    """
    if pos <= 0 or pos >= len(text):
        return True
    after = text[pos]
    before = text[pos - 1]
    code = ord(after)
    if 0xDC00 <= code <= 0xDFFF and 0xD800 <= ord(before) <= 0xDBFF:
        return False
    if after == _ZWJ or before == _ZWJ:
        return False
    if 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF or 0x1F3FB <= code <= 0x1F3FF:
        return False
    return unicodedata.combining(after) == 0


def next_char_boundary(text: str, pos: int, hi: int) -> int:
    """``pos`` 之后第一个合法切分点（至少前进一个码点）。"""
    end = pos + 1
    while end < hi and not is_char_boundary(text, end):
        end += 1
    return min(end, hi)
