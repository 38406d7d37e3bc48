"""按“扩展名 + 内容”双重判定文件格式。

只看文件开头（约 8 KiB）：改了扩展名的二进制（把 PNG/ELF/ZIP 改名成 .txt、不是 PDF 的 .pdf、
不是 Word 包的 .docx）在上传时就被拒绝，错误消息说明内容实际像什么，并列出支持的格式。
同一“家族”内的错配按内容纠正（.jpg 里其实是 PNG、.xls 里其实是 xlsx 或网页导出的 HTML），
因为这类文件在真实环境里很常见，且内容本身完全可以解析。
开头不足以下结论的情况（例如 OLE 目录不在前 8 KiB）放行，由解析阶段读完整文件再判定。
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import PurePath

from raglib.parsing.base import ParseError, UnsupportedFormatError

SUPPORTED_EXTENSIONS: tuple[str, ...] = (
    ".pdf", ".docx", ".xlsx", ".xls", ".csv", ".pptx", ".txt", ".md", ".markdown", ".html", ".htm", ".png", ".jpg",
    ".jpeg", ".epub", ".msg",
)

# 扩展名 → 格式名（ParsedDocument.format 的取值）
EXTENSION_FORMATS: dict[str, str] = {
    ".pdf": "pdf", ".docx": "docx", ".xlsx": "xlsx", ".xls": "xls", ".csv": "csv", ".pptx": "pptx", ".txt": "txt",
    ".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html", ".png": "png", ".jpg": "jpg",
    ".jpeg": "jpg", ".epub": "epub", ".msg": "msg",
}

OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08")

# 简单魔数 → (种类, 描述)。种类只在本模块内部使用。
_MAGICS: tuple[tuple[bytes, str, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "png", "a PNG image"),
    (b"\xff\xd8\xff", "jpg", "a JPEG image"),
    (b"GIF87a", "image", "a GIF image"),
    (b"GIF89a", "image", "a GIF image"),
    (b"II*\x00", "image", "a TIFF image"),
    (b"MM\x00*", "image", "a TIFF image"),
    (b"\x7fELF", "binary", "an ELF executable (Linux program)"),
    (b"\xcf\xfa\xed\xfe", "binary", "a Mach-O executable (macOS program)"),
    (b"\xfe\xed\xfa\xcf", "binary", "a Mach-O executable (macOS program)"),
    (b"\x00asm", "binary", "a WebAssembly module"),
    (b"\x1f\x8b", "binary", "a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "binary", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "binary", "a RAR archive"),
    (b"\xfd7zXZ\x00", "binary", "an xz archive"),
    (b"SQLite format 3\x00", "binary", "an SQLite database"),
    (b"{\\rtf", "other", "an RTF document"),
    (b"%!PS", "other", "a PostScript document"),
    (b"ID3", "binary", "an MP3 audio file"),
    (b"OggS", "binary", "an Ogg audio/video file"),
    (b"fLaC", "binary", "a FLAC audio file"),
)

_TEXT_CONTROL_BYTES = frozenset(b"\t\n\r\x0c\x1b")


@dataclass(frozen=True)
class ContentKind:
    """内容嗅探结果：kind 供判定用，description 写进错误消息（英文，带冠词）。"""

    kind: str
    description: str


def _zip_member_names(head: bytes) -> list[str]:
    """从文件开头的 ZIP 本地文件头里读出成员名（读到哪算哪，不依赖中央目录）。"""
    names: list[str] = []
    pos = 0
    while len(names) < 64:
        pos = head.find(b"PK\x03\x04", pos)
        if pos < 0 or pos + 30 > len(head):
            break
        flags, = struct.unpack_from("<H", head, pos + 6)
        compressed_size, = struct.unpack_from("<I", head, pos + 18)
        name_len, extra_len = struct.unpack_from("<HH", head, pos + 26)
        raw = head[pos + 30:pos + 30 + name_len]
        if len(raw) < name_len:
            break
        names.append(raw.decode("utf-8", "replace"))
        if flags & 0x08 or compressed_size == 0:
            # 有数据描述符时大小写在数据之后：退而搜索下一个本地文件头
            pos += 30 + name_len
        else:
            pos += 30 + name_len + extra_len + compressed_size
    return names


# OOXML 包里常见的顶层部件前缀；开头出现任何一个都说明“是 Office 包，只是还没看到主部件”
_OOXML_PREFIXES = ("[Content_Types].xml", "_rels/", "docProps/", "customXml/", "word/", "xl/", "ppt/")


def _describe_zip(head: bytes) -> ContentKind:
    names = _zip_member_names(head)
    if b"mimetypeapplication/epub+zip" in head[:200]:
        return ContentKind("zip-epub", "an EPUB e-book (ZIP)")
    if b"mimetypeapplication/vnd.oasis.opendocument" in head[:200]:
        return ContentKind("zip-odf", "an OpenDocument file (.odt/.ods/.odp)")
    if any(name.startswith("word/") for name in names):
        return ContentKind("zip-docx", "a Word document (.docx)")
    if any(name.startswith("xl/") for name in names):
        return ContentKind("zip-xlsx", "an Excel workbook (.xlsx)")
    if any(name.startswith("ppt/") for name in names):
        return ContentKind("zip-pptx", "a PowerPoint presentation (.pptx)")
    if any(name.startswith("visio/") for name in names):
        return ContentKind("zip-other", "a Visio drawing (.vsdx)")
    if any(name.startswith(_OOXML_PREFIXES) for name in names):
        return ContentKind("zip-ooxml", "an Office Open XML package")
    if not names:
        # 读不出成员名（例如开头是分卷或被截断）：先放行，解析时打开完整 ZIP 再判定
        return ContentKind("zip-unknown", "a ZIP archive")
    shown = ", ".join(names[:3])
    return ContentKind("zip", f"a ZIP archive (containing {shown})")


def describe_ole(data: bytes | mmap.mmap) -> ContentKind:
    """按 OLE 复合文档里的流名判断它是什么（流名以 UTF-16LE 存在目录扇区中；可传整文件的 mmap）。"""

    def has(name: str) -> bool:
        return data.find(name.encode("utf-16-le")) >= 0

    if has("EncryptedPackage"):
        return ContentKind("ole-encrypted", "an encrypted (password protected) Office document")
    if has("WordDocument"):
        return ContentKind("ole-doc", "a legacy Word 97-2003 document (.doc)")
    if has("PowerPoint Document"):
        return ContentKind("ole-ppt", "a legacy PowerPoint 97-2003 presentation (.ppt)")
    if has("__substg1.0_"):
        return ContentKind("ole-msg", "an Outlook e-mail message (.msg)")
    if has("Workbook") or has("Book"):
        return ContentKind("ole-xls", "a legacy Excel 97-2003 workbook (.xls)")
    return ContentKind("ole", "an OLE compound file (a legacy Microsoft Office format)")


def looks_like_text(head: bytes) -> bool:
    """粗判是否文本：有 BOM、像无 BOM 的 UTF-16，或几乎没有控制字符。"""
    if not head or head.startswith((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")):
        return True
    sample = head[:4096]
    zeros = sample.count(0)
    if zeros:
        # 无 BOM 的 UTF-16：零字节集中在奇数位或偶数位
        even = sample[0::2].count(0)
        odd = sample[1::2].count(0)
        half = max(len(sample) // 2, 1)
        return max(even, odd) / half > 0.3 and min(even, odd) / half < 0.02
    controls = sum(1 for byte in sample if byte < 0x20 and byte not in _TEXT_CONTROL_BYTES)
    return controls / len(sample) < 0.02


def _looks_like_html(head: bytes) -> bool:
    start = head[:2048].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if start.startswith((b"<!doctype html", b"<html")):
        return True
    return any(tag in start for tag in (b"<html", b"<body", b"<table", b"<head>"))


def sniff(head: bytes) -> ContentKind:
    """只凭开头字节判断内容像什么。"""
    if not head:
        return ContentKind("empty", "an empty file")
    if b"%PDF-" in head[:1024]:
        return ContentKind("pdf", "a PDF document")
    if head.startswith(ZIP_MAGICS):
        return _describe_zip(head)
    if head.startswith(OLE_MAGIC):
        return describe_ole(head)
    for magic, kind, description in _MAGICS:
        if head.startswith(magic):
            return ContentKind(kind, description)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return ContentKind("image", "a WebP image")
    if head[4:8] == b"ftyp":
        return ContentKind("binary", "an MP4/MOV media file")
    if head.startswith(b"MZ") and 0 in head[:1024]:
        return ContentKind("binary", "a Windows executable")
    if looks_like_text(head):
        if _looks_like_html(head):
            return ContentKind("html", "an HTML page")
        return ContentKind("text", "plain text")
    return ContentKind("binary", "binary data of an unknown kind")


def supported_list() -> str:
    return ", ".join(SUPPORTED_EXTENSIONS)


def unsupported(message: str) -> UnsupportedFormatError:
    """统一的“不支持”异常：消息末尾附支持的格式列表（调用方按 '. Supported' 截取前半句）。"""
    return UnsupportedFormatError(f"{message}. Supported formats: {supported_list()}", supported=SUPPORTED_EXTENSIONS)


# 每个格式可接受的内容种类 → 实际格式；None 表示沿用扩展名对应的格式
_ACCEPTED: dict[str, dict[str, str | None]] = {
    "pdf": {"pdf": None},
    "png": {"png": "png", "jpg": "jpg"},
    "jpg": {"png": "png", "jpg": "jpg"},
    # 开头没看到成员名的 ZIP、目录不在开头的 OLE：放行，解析时读完整文件再判定
    "docx": {"zip-docx": None, "zip-ooxml": None, "zip-unknown": None, "ole-encrypted": None, "ole": None},
    "pptx": {"zip-pptx": None, "zip-ooxml": None, "zip-unknown": None, "ole-encrypted": None, "ole": None},
    "xlsx": {"zip-xlsx": None, "zip-ooxml": None, "zip-unknown": None, "ole-encrypted": None, "ole": None,
             "ole-xls": "xls"},
    # 很多系统导出的 .xls 其实是 xlsx、HTML 表格或制表符分隔的文本
    "xls": {"ole-xls": None, "ole": None, "ole-encrypted": None, "zip-xlsx": "xlsx", "html": "html", "text": "txt"},
    # CSV 只能是文本（任何编码）；HTML 表格导出成 .csv 的不认，免得把标签当成单元格
    "csv": {"text": None},
    "txt": {"text": None, "html": None},
    "markdown": {"text": None, "html": None},
    "html": {"html": None, "text": None},
    "epub": {"zip-epub": None},
    "msg": {"ole-msg": None, "ole": None},
}

# 没有扩展名时，仅凭内容能确定的格式
_BY_CONTENT: dict[str, str] = {
    "pdf": "pdf", "png": "png", "jpg": "jpg", "zip-docx": "docx", "zip-xlsx": "xlsx", "zip-pptx": "pptx",
    "ole-xls": "xls", "html": "html", "text": "txt", "zip-epub": "epub", "ole-msg": "msg",
}


def detect_format(head: bytes, filename: str) -> str:
    """按扩展名与内容判定格式，返回 ParsedDocument.format 的取值。

    ``head`` 是文件的前约 8 KiB。空文件按扩展名放行（解析阶段会报“文件为空”）。
    不支持或内容与扩展名不符时抛 UnsupportedFormatError，消息说明内容像什么并列出支持的格式。
    """
    ext = PurePath(filename).suffix.lower()
    content = sniff(head)
    if ext not in EXTENSION_FORMATS:
        if not ext and content.kind in _BY_CONTENT:
            return _BY_CONTENT[content.kind]
        shown = f"'{ext}'" if ext else "without an extension"
        raise unsupported(f"Unsupported file type {shown} ('{filename}'); the content looks like {content.description}")
    declared = EXTENSION_FORMATS[ext]
    if content.kind == "empty":
        return declared
    accepted = _ACCEPTED[declared]
    if content.kind not in accepted:
        raise unsupported(
            f"The file is named '{filename}' but its content looks like {content.description}, "
            f"not a {ext} file")
    return accepted[content.kind] or declared


def require_not_empty(size: int) -> None:
    if size == 0:
        raise ParseError("The file is empty (0 bytes)")
