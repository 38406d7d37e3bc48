"""解析层的公共数据类型与异常。

解析结果是不可变的数据类：下游（分块、入库）只读不改；异常消息写给维护者看（英文），
``permanent`` 区分“再试也没用”（损坏、加密、空文件）与“可能是暂时的”（OCR 引擎运行出错）。
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """文档的一个片段（Markdown），附带它在原文件中的位置。

    位置字段按格式取其一：PDF 填 ``page``，表格文件填 ``sheet``，演示文稿填 ``slide``；
    其余格式（DOCX、TXT、HTML、图片）整篇一个片段，位置全为 None。
    """

    text: str
    page: int | None = None
    sheet: str | None = None
    slide: int | None = None


@dataclass(frozen=True)
class ParsedDocument:
    """一个文件的解析结果：按文档顺序排列的片段 + OCR 情况 + 给维护者的说明。

    ``notes`` 是解析成功、但有内容没能收进来时的说明（英文句子，如“某张图片像素超限被跳过”），
    摄取把它记在文档上，维护者不看 worker 日志也知道缺了什么。
    """

    segments: tuple[Segment, ...]
    format: str
    ocr_engine: str | None
    ocr_images: int
    ocr_skipped: bool
    notes: tuple[str, ...] = ()

    @property
    def markdown(self) -> str:
        """整篇 Markdown：片段之间空一行。"""
        return "\n\n".join(segment.text for segment in self.segments)


class ParseError(Exception):
    """文件无法解析。消息是给维护者看的英文句子，直接说明问题（加密、损坏、无文字……）。"""

    permanent: bool = True

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.message = message
        # 实例属性：同一类异常在不同场景下可能是暂时性的（例如 OCR 引擎运行时崩溃）
        self.permanent = permanent


class UnsupportedFormatError(ParseError):
    """扩展名不在支持列表内，或内容与扩展名不符（改了扩展名的二进制文件）。"""

    def __init__(self, message: str, *, supported: tuple[str, ...]) -> None:
        super().__init__(message, permanent=True)
        self.supported = supported
