"""恶意与畸形文件的生成器：实测脚本（bench/hostile_files.py）与测试（tests/documents/test_hostile_files.py）共用。

放在 bench/ 下，是因为 bench/ 不导入 tests/；测试从这里导入（``from bench.helpers import hostile_samples``）。

全部在运行时生成、边生成边写盘（ZIP 炸弹与像素炸弹的“解压后”大小是几百 MB，生成时内存只占几 MB），
裸克隆上不依赖任何外部文件。
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path

_CONTENT_TYPES = (
    '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    '<Default Extension="xml" ContentType="application/xml"/></Types>'
)
_MEGABYTE = 1024 * 1024


def _stream_member(archive: zipfile.ZipFile, name: str, head: bytes, filler: bytes, size: int, tail: bytes) -> None:
    """写一个解压后约 ``size`` 字节的高度可压缩成员，边压缩边写，不在内存里拼出整段。"""
    with archive.open(name, "w", force_zip64=True) as member:
        member.write(head)
        block = filler * max(1, _MEGABYTE // len(filler))
        written = len(head)
        while written < size:
            member.write(block)
            written += len(block)
        member.write(tail)


def zip_bomb_docx(path: Path, *, megabytes: int) -> Path:
    """word/document.xml 解压后约 ``megabytes`` MB 的 DOCX（磁盘上不到百分之一）。"""
    paragraph = b"<w:p><w:r><w:t>zip bomb paragraph</w:t></w:r></w:p>"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", _CONTENT_TYPES)
        _stream_member(
            archive, "word/document.xml",
            b'<?xml version="1.0"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
            b"<w:body>", paragraph, megabytes * _MEGABYTE, b"</w:body></w:document>")
    return path


def zip_bomb_xlsx(path: Path, *, sheets: int, megabytes_per_sheet: int) -> Path:
    """每个成员都在单成员上限以内、但总和超过总上限的 XLSX。"""
    row = b'<row><c t="inlineStr"><is><t>bomb</t></is></c></row>'
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", _CONTENT_TYPES)
        for number in range(1, sheets + 1):
            _stream_member(
                archive, f"xl/worksheets/sheet{number}.xml",
                b'<?xml version="1.0"?><worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
                b"<sheetData>", row, megabytes_per_sheet * _MEGABYTE, b"</sheetData></worksheet>")
    return path


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def pixel_bomb_png(path: Path, *, side: int) -> Path:
    """真正的 ``side``x``side`` 灰度 PNG（全白）：解码后 side² 字节，文件只有几百 KB。"""
    compressor = zlib.compressobj(9)
    row = b"\x00" + b"\xff" * side  # 每行前面是过滤类型 0
    with path.open("wb") as out:
        out.write(b"\x89PNG\r\n\x1a\n")
        out.write(_png_chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)))
        data = bytearray()
        for _ in range(side):
            data += compressor.compress(row)
        data += compressor.flush()
        out.write(_png_chunk(b"IDAT", bytes(data)))
        out.write(_png_chunk(b"IEND", b""))
    return path


def one_line_text(path: Path, *, megabytes: int) -> Path:
    """一整行、没有换行的英文文本。"""
    sentence = b"the quick brown fox jumps over the lazy dog and keeps running "
    with path.open("wb") as out:
        for _ in range(megabytes * _MEGABYTE // len(sentence)):
            out.write(sentence)
    return path


def unpunctuated_chinese(path: Path, *, megabytes: int) -> Path:
    """没有任何标点、空白与换行的中文（UTF-8 约 ``megabytes`` MB）。"""
    # 一段常见汉字轮流重复，避免整篇只有一个字被分词器合并成极少的 token
    alphabet = "招标文件投标人资格要求评分办法合同条款技术规格服务期限付款方式质量保证售后维护项目预算采购需求"
    unit = (alphabet * 64).encode("utf-8")
    with path.open("wb") as out:
        for _ in range(megabytes * _MEGABYTE // len(unit)):
            out.write(unit)
    return path


def nested_html(path: Path, *, depth: int) -> Path:
    """``depth`` 层嵌套的 <div>，最里面是一句正文。"""
    path.write_text("<html><body>" + "<div>" * depth + "<p>嵌套最深处的正文</p>" + "</div>" * depth + "</body></html>",
                    encoding="utf-8")
    return path
