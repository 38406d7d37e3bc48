"""迁移 search.0009 回填前缀 df 时用的词典块解析：:mod:`raglib.lexicon` 当时格式的冻结副本（迁移不导入应用代码）。

词典块的字节格式（小端）：``u16 n | u32 L | L 字节词位（UTF-8，以 NUL 分隔） | u32 df[n] | ...``，这里只读到 df。
以下划线开头，Django 不把它当成迁移。
"""

from __future__ import annotations

import struct

_HEADER = struct.Struct("<HI")


def block_dfs(data: bytes) -> list[tuple[str, int]]:
    """一个词典块里的 (词位, 段内 df)。"""
    n, names_length = _HEADER.unpack_from(data)
    offset = _HEADER.size
    lexemes = data[offset:offset + names_length].decode("utf-8").split("\x00")
    dfs = struct.unpack_from(f"<{n}I", data, offset + names_length)
    return list(zip(lexemes, dfs, strict=True))
