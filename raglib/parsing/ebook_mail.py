"""EPUB 电子书与 Outlook .msg 邮件：markitdown 转成 Markdown，整篇一个片段。"""

from __future__ import annotations

# markitdown 在函数里导入：较重，只有解析 EPUB / Outlook 邮件时才加载。
import io
from pathlib import Path

from raglib.parsing.base import ParseError, Segment
from raglib.parsing.ocr_session import OcrSession

_LABELS = {"epub": "EPUB e-book", "msg": "Outlook message"}


def _convert(path: Path, fmt: str) -> list[Segment]:
    # 延迟导入：markitdown 较重
    from markitdown import StreamInfo
    from markitdown.converters import EpubConverter, OutlookMsgConverter

    converter = EpubConverter() if fmt == "epub" else OutlookMsgConverter()
    try:
        result = converter.convert(io.BytesIO(path.read_bytes()), StreamInfo(extension=f".{fmt}"))
    except MemoryError:
        # 不翻译成“可重试”：解析子进程里内存耗尽就是撞到了 RAG_INGEST_PARSE_MEMORY，再试也一样（documents.sandbox 报告）
        raise
    except Exception as exc:  # zip/olefile/bs4 的异常类型各异，统一翻译成维护者看得懂的话
        raise ParseError(f"The {_LABELS[fmt]} is damaged or could not be read: {type(exc).__name__}: {exc}") from exc
    text = str(result.markdown or "")
    return [Segment(text=text)] if text.strip() else []


def parse_epub(path: Path, session: OcrSession) -> list[Segment]:
    """EPUB：元数据与各章节正文。"""
    return _convert(path, "epub")


def parse_msg(path: Path, session: OcrSession) -> list[Segment]:
    """Outlook .msg：发件人、收件人、主题与正文。"""
    return _convert(path, "msg")
