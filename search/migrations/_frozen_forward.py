"""迁移 search.0016 回填正排时用的编码：:mod:`raglib.forward` 当时格式的冻结副本（迁移不导入应用代码）。

格式：``zlib(u32 n | 词位的 GB18030 以 NUL 分隔 | NUL | n 字节正文词频 | n 字节标题词频)``，词频截到 255。
以下划线开头，Django 不把它当成迁移。
"""

from __future__ import annotations

import struct
import zlib


def forward(lexemes: list[str], titles: list[int], bodies: list[int]) -> bytes:
    """一个分块的正排（词位已按 tsvector 的顺序，词频与词位同序）。"""
    raw = struct.pack("<I", len(lexemes)) + "\0".join(lexemes).encode("gb18030") + b"\0"
    raw += bytes(min(max(tf, 0), 255) for tf in bodies) + bytes(min(max(tf, 0), 255) for tf in titles)
    return zlib.compress(raw, 9)
