"""最外层中间件：请求 ID、访问日志、HTTP 指标；超限请求的统一错误；分块传输的请求体。"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable
from typing import IO

import structlog
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import translation

from infra import metrics
from infra.api import MULTIPART_SLACK
from infra.context import REQUEST_ID_KEY, new_request_id
from infra.errors import ErrorCode, ErrorDetail, is_api_path, json_error_response

logger = structlog.get_logger("ragservice.access")

_CONVERTER = re.compile(r"<(?:[^:>]+:)?([^>]+)>")
UNMATCHED_ENDPOINT = "<unmatched>"


def route_template(request: HttpRequest) -> str:
    """把 Django 路由 ``knowledge_bases/<uuid:kb_id>`` 规范为 ``/knowledge_bases/{kb_id}``。

    指标的 endpoint 标签必须是模板而不是原始路径，否则每个 id 都会生成一条时间序列。
    """
    match = getattr(request, "resolver_match", None)
    if match is None or match.route is None:
        return UNMATCHED_ENDPOINT
    route = _CONVERTER.sub(r"{\1}", match.route).lstrip("^").rstrip("$")
    return "/" + route


def _header_bytes(request: HttpRequest) -> int:
    """请求头的大致字节数：名字 + 值 + 分隔符，与 gunicorn 计量的口径接近。"""
    return sum(len(name) + len(str(value)) + 4 for name, value in request.headers.items())


def oversize_request_response(request: HttpRequest) -> HttpResponse | None:
    """超长 URL → 414 URI_TOO_LONG，请求头过大 → 431 HEADERS_TOO_LARGE，用统一错误格式回答。

    gunicorn 的限制（见 ragservice/gunicorn_conf.py）放得比这里宽，所以常见的超限请求能走到这里、
    得到带请求 ID 的 JSON 错误，而不是 gunicorn 的 HTML 页；更离谱的请求仍由 gunicorn 在解析时拒绝。
    """
    if len(request.get_full_path()) > settings.MAX_URL_LENGTH:
        return json_error_response(
            414, ErrorCode.URI_TOO_LONG, "Request URI is too long",
            [ErrorDetail(None, "TOO_LONG", f"Maximum URI length is {settings.MAX_URL_LENGTH} characters")],
        )
    if _header_bytes(request) > settings.MAX_HEADER_BYTES:
        return json_error_response(
            431, ErrorCode.HEADERS_TOO_LARGE, "Request header fields are too large",
            [ErrorDetail(None, "TOO_LARGE", f"Request headers must total at most {settings.MAX_HEADER_BYTES} bytes")],
        )
    return None


# 分块传输的请求体先落到这个临时文件：这么大以内留在内存，再大写到磁盘
_SPOOL_IN_MEMORY = 1 << 20
_READ_SIZE = 64 * 1024


def chunked_body_limit(request: HttpRequest) -> tuple[int, ErrorDetail]:
    """没有 Content-Length 的请求体最多读多少字节，以及超限时 413 的字段级说明。

    multipart（上传文档）与视图里按 Content-Length 预先拒绝的口径相同：RAG_MAX_DOCUMENT_SIZE 加上边界与表单
    字段的余量；其余请求体（JSON）是 RAG_MAX_REQUEST_BODY。
    """
    if (request.content_type or "").startswith("multipart/"):
        return settings.MAX_DOCUMENT_SIZE + MULTIPART_SLACK, ErrorDetail(
            "file", "TOO_LARGE", f"Maximum size is {settings.MAX_DOCUMENT_SIZE} bytes (RAG_MAX_DOCUMENT_SIZE)")
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return limit, ErrorDetail(None, "TOO_LARGE", f"Maximum size is {limit} bytes (RAG_MAX_REQUEST_BODY)")


def spool_chunked_body(request: HttpRequest) -> tuple[IO[bytes] | None, HttpResponse | None]:
    """``Transfer-Encoding: chunked``、没有 Content-Length 的请求体：读进临时文件，补上 Content-Length。

    gunicorn 解开分块编码，把请求体交给 ``wsgi.input`` 并设 ``wsgi.input_terminated``（读到末尾就是 EOF），
    但不设 CONTENT_LENGTH；Django 的 WSGIRequest 却只按 CONTENT_LENGTH 读（缺省当作 0，
    ``LimitedStream(wsgi.input, 0)``），DRF 与 Django 的 multipart 解析器也都在长度为 0 时直接当作空请求体——
    分块发来的 JSON 与上传因此被读成空的。这里在任何人读请求体之前把它读完（至多上限 + 1 字节，
    超限立即 413，工作量有界；没读完的部分由 gunicorn 有限度地丢弃或关闭连接），再把长度与流交还给 Django，
    之后的大小检查（RequestDataTooBig、上传视图的预先拒绝、上传处理器的计数）照常生效。

    服务器没有声明 ``wsgi.input_terminated`` 时（如 runserver）读到末尾可能阻塞，保持原样。
    返回（要在请求结束时关闭的临时文件，提前结束请求的错误响应）。
    """
    meta = request.META
    if (meta.get("CONTENT_LENGTH") or not meta.get("wsgi.input_terminated")
            or "chunked" not in meta.get("HTTP_TRANSFER_ENCODING", "").lower()):
        return None, None
    limit, too_large = chunked_body_limit(request)
    spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # noqa: SIM115 - 由调用方在请求结束时关闭
    size = 0
    source = meta["wsgi.input"]
    try:
        while chunk := source.read(min(_READ_SIZE, limit + 1 - size)):
            size += len(chunk)
            if size > limit:
                spool.close()
                return None, json_error_response(
                    413, ErrorCode.PAYLOAD_TOO_LARGE, f"Request body exceeds the maximum size of {limit} bytes",
                    [too_large])
            spool.write(chunk)
    except OSError:
        # 分块编码本身不合法（gunicorn 的 InvalidChunkSize 等都是 OSError）或客户端中途断开
        spool.close()
        return None, json_error_response(
            400, ErrorCode.VALIDATION_ERROR, "Malformed request body",
            [ErrorDetail(None, "PARSE_ERROR", "The chunked request body could not be read")])
    spool.seek(0)
    meta["CONTENT_LENGTH"] = str(size)
    # WSGIRequest 从 _stream 读请求体（原本是长度为 0 的 LimitedStream）；临时文件读到 size 字节即 EOF
    request._stream = spool  # type: ignore[assignment]
    return spool, None


class RequestContextMiddleware:
    """为每个请求生成 UUID v4 请求 ID，绑定到日志上下文，写入响应头，并记录访问日志与指标。

    客户端自带的 X-Request-ID 不会被采用（请求 ID 由服务端生成，见 docs/INVARIANTS.md 的 REQUEST-ID），但会作为
    ``upstream_request_id`` 记入日志，便于跨服务追踪。
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = new_request_id()
        started = time.perf_counter()
        fields = {REQUEST_ID_KEY: request_id}
        upstream = request.headers.get("X-Request-ID")
        if upstream:
            fields["upstream_request_id"] = upstream[:128]
        # API 面向程序：错误信息固定用英文，便于调用方匹配；admin 与页面面向维护者，用中文
        language = "en" if is_api_path(request.path) else settings.LANGUAGE_CODE
        with structlog.contextvars.bound_contextvars(**fields), translation.override(language):
            spool, response = spool_chunked_body(request)
            try:
                response = response or oversize_request_response(request) or self.get_response(request)
            finally:
                if spool is not None:
                    spool.close()
            duration = time.perf_counter() - started
            endpoint = route_template(request)
            response["X-Request-ID"] = request_id
            metrics.observe_http_request(request.method or "", endpoint, response.status_code, duration)
            logger.info(
                "http_request",
                method=request.method,
                route=endpoint,
                path=request.path,
                status=response.status_code,
                duration_ms=round(duration * 1000, 2),
                api_key=getattr(getattr(request, "auth", None), "name", None),
            )
        return response


# 管理后台与检索调试页的内容安全策略：脚本只来自本站（Django admin 不用内联脚本），调试页的
# 内联样式需要 'unsafe-inline'；不许被别的站点嵌入，表单只能提交回本站
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'self'"
)
_CSP_PATHS = ("/admin/", "/playground/")


class ContentSecurityPolicyMiddleware:
    """给管理后台与检索调试页（给人看的 HTML 页面）加 Content-Security-Policy 头。"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path.startswith(_CSP_PATHS):
            response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response
