"""上传大小限制：边接收边计数，超过 RAG_MAX_DOCUMENT_SIZE 立即中止，绝不把大请求体读进内存。"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.uploadhandler import TemporaryFileUploadHandler

from ragservice.errors import ApplicationError, ErrorCode, ErrorDetail


def payload_too_large(limit: int) -> ApplicationError:
    return ApplicationError(
        ErrorCode.PAYLOAD_TOO_LARGE,
        f"Uploaded file exceeds the maximum size of {limit} bytes",
        413,
        [ErrorDetail("file", "TOO_LARGE", f"Maximum size is {limit} bytes (RAG_MAX_DOCUMENT_SIZE)")],
    )


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
