"""最外层中间件：请求 ID、访问日志、HTTP 指标。"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import structlog
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import translation

from infra import metrics
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
            response = oversize_request_response(request) or self.get_response(request)
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
