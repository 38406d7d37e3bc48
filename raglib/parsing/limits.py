"""摄取的硬上限：解析出的字符数、ZIP 容器的解压大小、图片像素。

恶意或畸形的文件（ZIP 炸弹、声明 20000x20000 的 PNG、几十 MB 的单行文本）不能让 worker 无限制地
占内存和时间。这里的检查都在“花大力气之前”做：ZIP 只读中央目录、图片只读文件头、文本解码后
立即计数。超限抛 ``LimitExceeded``（永久性失败），消息写明是哪个上限与对应的环境变量，
维护者看到就知道该拆文件还是调大配置。

本模块不依赖 Django：解析子进程（``documents.sandbox``）里也要用它，上限由父进程从 settings
构造 ``ParseLimits`` 后传进来。
"""

from __future__ import annotations

import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raglib.parsing.base import ParseError

ZIP_MAGIC = b"PK\x03\x04"
# 压缩比检查只看解压后超过这个大小的成员：小部件（样式表、关系文件）压缩比高很正常，也不占内存
RATIO_GRACE_BYTES = 1024 * 1024


class LimitExceeded(ParseError):
    """文件超过了某个摄取上限；重试也不会变小，所以是永久性失败。"""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=True)


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):.0f} MB"


@dataclass(frozen=True)
class ParseLimits:
    """一次解析的上限；默认值与 settings 中 ``RAG_INGEST_*`` 的默认值相同。"""

    max_chars: int = 10_000_000
    max_archive_member: int = 100 * 1024 * 1024
    max_archive_total: int = 300 * 1024 * 1024
    max_archive_ratio: int = 100
    max_image_pixels: int = 50_000_000

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ParseLimits:
        return cls(**{key: int(value) for key, value in values.items()})

    def check_chars(self, count: int) -> None:
        """解析出（或解码出）的字符数超限即失败：分块、embedding、入库的代价都与它成正比。"""
        if count > self.max_chars:
            raise LimitExceeded(
                f"The document has {count:,} characters of text, more than the limit of {self.max_chars:,} "
                "(RAG_INGEST_MAX_CHARS); split it into smaller files")

    def check_archive(self, path: Path) -> None:
        """只读 ZIP 中央目录，解压前拒绝 ZIP 炸弹。

        单个成员与总和之外还查压缩比（同 Apache POI 的 ZipSecureFile，默认 100 倍）：实测 mammoth 解析 DOCX
        要占 document.xml 大小 40~50 倍的内存，40 MB 的 XML 只压成 0.1 MB 就能把解析子进程撑到 2 GB 上限。
        正常 Office 文件的 XML 压缩比在 5~20 倍，图片几乎不可压缩。

        声明的大小可以撒谎，但 Python 的 zipfile（python-docx、openpyxl、mammoth、markitdown 都用它）
        读成员时最多解出声明的字节数，多出的部分会以 CRC 错误失败，所以按声明大小判断是可靠的。
        """
        try:
            with zipfile.ZipFile(path) as archive:
                members = archive.infolist()
        except (zipfile.BadZipFile, OSError, ValueError):
            # 不是可读的 ZIP：交给各格式的解析器给出“文件损坏”之类更具体的说明
            return
        total = 0
        for member in members:
            if member.file_size > self.max_archive_member:
                raise LimitExceeded(
                    f"The archive member '{member.filename[:200]}' unpacks to {_megabytes(member.file_size)}, "
                    f"more than the limit of {_megabytes(self.max_archive_member)} per member "
                    "(RAG_INGEST_MAX_ARCHIVE_MEMBER); the file looks like a zip bomb")
            ratio = member.file_size / max(member.compress_size, 1)
            if member.file_size > RATIO_GRACE_BYTES and ratio > self.max_archive_ratio:
                raise LimitExceeded(
                    f"The archive member '{member.filename[:200]}' unpacks to {_megabytes(member.file_size)} from "
                    f"{member.compress_size:,} bytes (ratio {ratio:.0f}), more than the limit ratio of "
                    f"{self.max_archive_ratio} (RAG_INGEST_MAX_ARCHIVE_RATIO); the file looks like a zip bomb")
            total += member.file_size
        if total > self.max_archive_total:
            raise LimitExceeded(
                f"The archive unpacks to {_megabytes(total)} in total, more than the limit of "
                f"{_megabytes(self.max_archive_total)} (RAG_INGEST_MAX_ARCHIVE_TOTAL); the file looks like a zip bomb")

    def pixels_message(self, description: str) -> str:
        """“图片太大”的说明：解码前只读了文件头，解码本身才是占内存的那一步。"""
        return (f"The image is too large: {description}, more than the limit of "
                f"{self.max_image_pixels / 1e6:.0f} M pixels (RAG_INGEST_MAX_IMAGE_PIXELS)")


def is_zip(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(len(ZIP_MAGIC)) == ZIP_MAGIC
