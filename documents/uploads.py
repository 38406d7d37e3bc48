"""上传的校验：大小限制（边接收边计数，超过 RAG_MAX_DOCUMENT_SIZE 立即中止，绝不把大请求体读进内存）与文件名清理。"""

from __future__ import annotations

import unicodedata
from pathlib import PurePath
from typing import Any

from django.conf import settings
from django.core.files.uploadhandler import TemporaryFileUploadHandler

from infra.errors import ApplicationError, ErrorCode, ErrorDetail


def payload_too_large(limit: int) -> ApplicationError:
    return ApplicationError(
        ErrorCode.PAYLOAD_TOO_LARGE,
        f"Uploaded file exceeds the maximum size of {limit} bytes",
        413,
        [ErrorDetail("file", "TOO_LARGE", f"Maximum size is {limit} bytes (RAG_MAX_DOCUMENT_SIZE)")],
    )


# 文件名的最大长度（字符）：常见文件系统的上限，也远小于 documents.filename 列的 512
MAX_FILENAME_CHARS = 255


def upload_filename(name: str) -> str:
    """上传时的文件名只用于显示、格式判定与分块元数据（存盘用文档 id），但仍不能原样信任：
    去掉目录部分（``../``、``C:\\`` 之类）、控制与格式字符（NUL、ESC、RLO 等双向控制符会伪装扩展名），
    超长时保留扩展名截断。Django 的 multipart 解析已做过类似清理，这里兜住不经 HTTP 的调用方。
    """
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    if len(base) > 2 and base[1] == ":" and base[0].isalpha():
        base = base[2:]
    cleaned = "".join(char for char in base if not unicodedata.category(char).startswith("C")).strip()
    if cleaned in ("", ".", ".."):
        raise ApplicationError(
            ErrorCode.VALIDATION_ERROR, "Request validation failed", 400,
            [ErrorDetail("file", "INVALID", "The file name is empty once path and control characters are removed")])
    if len(cleaned) > MAX_FILENAME_CHARS:
        suffix = PurePath(cleaned).suffix[:16]
        cleaned = cleaned[: MAX_FILENAME_CHARS - len(suffix)] + suffix
    return cleaned


class LimitedTemporaryFileUploadHandler(TemporaryFileUploadHandler):
    """写入临时文件的上传处理器；累计字节数超限时抛 413。

    Content-Length 已声明超限的请求在视图里更早被拒绝（不读请求体）；这里兜住分块传输
    或谎报长度的请求。
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.received = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        if self.received > settings.MAX_DOCUMENT_SIZE:
            self.file.close()
            raise payload_too_large(settings.MAX_DOCUMENT_SIZE)
        return super().receive_data_chunk(raw_data, start)
