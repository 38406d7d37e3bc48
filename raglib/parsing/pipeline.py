"""解析入口：判定格式 → 按注册表分派给对应解析器 → 汇总 OCR 记账 → 空文档报错。"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import structlog

from raglib.parsing.base import ParsedDocument, ParseError, Segment
from raglib.parsing.delimited import parse_csv
from raglib.parsing.detect import detect_format
from raglib.parsing.ebook_mail import parse_epub, parse_msg
from raglib.parsing.limits import LimitExceeded, ParseLimits, is_zip
from raglib.parsing.ocr import OcrEngine
from raglib.parsing.ocr_session import OcrSession
from raglib.parsing.office import parse_docx, parse_pptx, parse_xls, parse_xlsx
from raglib.parsing.pdf import parse_pdf
from raglib.parsing.text import parse_html, parse_txt

logger = structlog.get_logger(__name__)

HEAD_BYTES = 8192


class Parser(Protocol):
    """一个格式的解析器：读文件，返回按文档顺序的片段；需要 OCR 的图片交给 session。"""

    def __call__(self, path: Path, session: OcrSession) -> list[Segment]: ...


def parse_image(path: Path, session: OcrSession) -> list[Segment]:
    """PNG/JPG：整张图 OCR 成一个片段；像素超限的图片直接失败（报“图片太大”，而不是“没识别出文字”）。"""
    data = path.read_bytes()
    too_large = session.oversized_image(data, where="the image file")
    if too_large is not None:
        raise LimitExceeded(too_large)
    text = session.recognize_bytes(data, where="image file")
    return [Segment(text=text)] if text else []


PARSERS: dict[str, Parser] = {
    "pdf": parse_pdf,
    "docx": parse_docx,
    "pptx": parse_pptx,
    "xlsx": parse_xlsx,
    "xls": parse_xls,
    "csv": parse_csv,
    "txt": parse_txt,
    "markdown": parse_txt,
    "html": parse_html,
    "png": parse_image,
    "jpg": parse_image,
    "epub": parse_epub,
    "msg": parse_msg,
}


def _no_text_error(fmt: str, session: OcrSession) -> ParseError:
    """没有任何文字时，按原因给出不同的说明（以及是否值得重试）。"""
    if session.failures:
        return ParseError(
            f"No text could be extracted: OCR failed on {session.failures} image(s) "
            f"(engine {session.engine.name if session.engine else 'none'}); see the worker log",
            permanent=False)
    if session.skipped:
        return ParseError(
            "No text could be extracted: the content is in images and no OCR engine is available "
            "(install rapidocr or tesseract with chi_sim, or check RAG_OCR_ENGINE)")
    if session.oversized:
        return ParseError(
            f"No text could be extracted: {session.oversized} image(s) were skipped because they exceed the limit "
            f"of {session.limits.max_image_pixels / 1e6:.0f} M pixels (RAG_INGEST_MAX_IMAGE_PIXELS)")
    if fmt in ("png", "jpg"):
        return ParseError("No text could be extracted: OCR found no text in the image")
    return ParseError("No text could be extracted from the file (it contains no text, or only images without text)")


def parse_document(path: Path, *, filename: str, ocr: OcrEngine | None,
                   limits: ParseLimits | None = None) -> ParsedDocument:
    """解析一个文件为 Markdown 片段。

    ``filename`` 是用户上传时的文件名（扩展名参与格式判定；``path`` 可以是任意存储路径）。
    ``ocr`` 为 None 时不做 OCR：有图片内容则 ``ocr_skipped=True``，文字部分照常返回。
    损坏、加密、空文件、（OCR 后）没有任何文字时抛 ParseError；超过 ``limits``（默认值见 ``ParseLimits``）
    时抛 ``LimitExceeded``：ZIP 容器在解压前按中央目录检查，PDF 的压缩流在解压时检查，字符数在解析后检查。
    内存耗尽时 ``MemoryError`` 原样抛出（不是 ParseError）：是否值得重试只有调用方知道——解析子进程里
    它意味着撞到了 RAG_INGEST_PARSE_MEMORY，由 ``documents.sandbox`` 报告为永久失败。
    """
    limits = limits or ParseLimits()
    started = time.perf_counter()
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError as exc:
        raise ParseError(f"The file could not be read: {exc}", permanent=False) from exc
    if size == 0:
        raise ParseError("The file is empty (0 bytes)")
    fmt = detect_format(head, filename)
    if is_zip(path):
        limits.check_archive(path)
    session = OcrSession(engine=ocr, limits=limits)
    segments = tuple(segment for segment in PARSERS[fmt](path, session) if segment.text.strip())
    if not segments:
        raise _no_text_error(fmt, session)
    limits.check_chars(sum(len(segment.text) for segment in segments))
    parsed = ParsedDocument(segments=segments, format=fmt, ocr_engine=session.engine_used,
                            ocr_images=session.images, ocr_skipped=session.skipped, notes=tuple(session.notes))
    logger.info("document_parsed", format=fmt, segments=len(segments), chars=sum(len(s.text) for s in segments),
                ocr_engine=parsed.ocr_engine, ocr_images=parsed.ocr_images, ocr_skipped=parsed.ocr_skipped,
                ocr_failures=session.failures, notes=len(parsed.notes),
                duration_ms=round((time.perf_counter() - started) * 1000, 1))
    return parsed
