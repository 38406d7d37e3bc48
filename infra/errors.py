"""统一错误契约：所有非 2xx 响应都是

    {"error": {"code", "message", "request_id", "details": [{"field", "code", "message"}]}}

服务层只抛 ``ApplicationError``；DRF 的异常由 ``exception_handler`` 翻译，Django 层的
404/500（未知路由、中间件异常）由 ``handler404`` / ``handler500`` 渲染为同一格式。
500 只返回 INTERNAL_ERROR 与通用提示，堆栈、请求参数进 JSON 日志。
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog
from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import permission_denied
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from infra.context import current_request_id

logger = structlog.get_logger("infra.errors")


def is_api_path(path: str) -> bool:
    """业务 API（英文错误信息、JSON 错误页）与给人看的页面（管理后台、文档、检索调试页）的分界。"""
    return not path.startswith(("/admin/", "/api/docs/", "/playground/")) and path != "/"


class ErrorCode:
    """API 的全部错误码。错误码表（HTTP 状态与含义）在 README 的“错误格式与错误码”一节，
    见 docs/INVARIANTS.md 的 ERROR-CODES。"""

    VALIDATION_ERROR = "VALIDATION_ERROR"
    KNOWLEDGE_BASE_NOT_FOUND = "KNOWLEDGE_BASE_NOT_FOUND"
    DOCUMENT_NOT_FOUND = "DOCUMENT_NOT_FOUND"
    CLEANUP_TASK_NOT_FOUND = "CLEANUP_TASK_NOT_FOUND"
    KNOWLEDGE_BASE_UNAVAILABLE = "KNOWLEDGE_BASE_UNAVAILABLE"
    KNOWLEDGE_BASE_NAME_CONFLICT = "KNOWLEDGE_BASE_NAME_CONFLICT"
    KNOWLEDGE_BASE_DELETED = "KNOWLEDGE_BASE_DELETED"
    CLEANUP_TASK_NOT_RETRYABLE = "CLEANUP_TASK_NOT_RETRYABLE"
    DOCUMENT_DELETED = "DOCUMENT_DELETED"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
    # 以下是原始规范的错误码表之外、API 同样会产生的通用码（README 的表里一并列出）
    UNAUTHORIZED = "UNAUTHORIZED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    NOT_FOUND = "NOT_FOUND"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    NOT_ACCEPTABLE = "NOT_ACCEPTABLE"
    RATE_LIMITED = "RATE_LIMITED"
    URI_TOO_LONG = "URI_TOO_LONG"
    HEADERS_TOO_LARGE = "HEADERS_TOO_LARGE"
    DOCUMENT_BUSY = "DOCUMENT_BUSY"
    ITEM_NOT_FOUND = "ITEM_NOT_FOUND"
    EMBEDDING_FAILED = "EMBEDDING_FAILED"


@dataclass(frozen=True)
class ErrorDetail:
    """字段级错误。"""

    field: str | None
    code: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "code": self.code, "message": self.message}


@dataclass
class ApplicationError(Exception):
    """服务层唯一的业务异常类型，携带 HTTP 状态与错误码。"""

    code: str
    message: str
    status: int
    details: Sequence[ErrorDetail] = field(default_factory=list)
    # 额外的响应头，如暂时性失败的 Retry-After
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)


def not_found(code: str, resource: str, field_name: str, resource_id: object) -> ApplicationError:
    """资源不存在的 404（存在性校验），如 ``not_found(DOCUMENT_NOT_FOUND, "Document", "document_id", x)``。"""
    return ApplicationError(
        code, f"{resource} with id '{resource_id}' not found", 404,
        [ErrorDetail(field_name, "NOT_FOUND", "Resource does not exist")],
    )


def request_too_large() -> ApplicationError:
    """请求体（JSON，或 multipart 里文件以外的字段）超过 RAG_MAX_REQUEST_BODY。"""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return ApplicationError(
        ErrorCode.PAYLOAD_TOO_LARGE, f"Request body exceeds the maximum size of {limit} bytes", 413,
        [ErrorDetail(None, "TOO_LARGE", f"Maximum size is {limit} bytes (RAG_MAX_REQUEST_BODY)")],
    )


def error_body(code: str, message: str, details: Sequence[ErrorDetail] = ()) -> dict[str, Any]:
    """按规范拼出错误响应体。"""
    return {
        "error": {
            "code": code,
            "message": message,
            "request_id": current_request_id(),
            "details": [d.as_dict() for d in details],
        }
    }


def _flatten_validation(detail: Any, prefix: str | None = None) -> list[ErrorDetail]:
    """把 DRF 的嵌套校验错误展开成字段级列表，嵌套字段用点号连接（如 ``filters.tags``）。"""
    out: list[ErrorDetail] = []
    if isinstance(detail, Mapping):
        for key, value in detail.items():
            name = None if key in ("non_field_errors", "detail") else str(key)
            child = f"{prefix}.{name}" if prefix and name else (name or prefix)
            out.extend(_flatten_validation(value, child))
    elif isinstance(detail, list):
        for index, value in enumerate(detail):
            if isinstance(value, Mapping | list):
                out.extend(_flatten_validation(value, f"{prefix}[{index}]" if prefix else str(index)))
            else:
                out.extend(_flatten_validation(value, prefix))
    else:
        code = getattr(detail, "code", None) or "invalid"
        out.append(ErrorDetail(field=prefix, code=str(code).upper(), message=str(detail)))
    return out


def validation_error(detail: Any) -> ApplicationError:
    """DRF 校验错误 → 400 VALIDATION_ERROR（字段级 details），供逐条校验的批量接口放进每条结果。"""
    return ApplicationError(ErrorCode.VALIDATION_ERROR, "Request validation failed", 400, _flatten_validation(detail))


_DRF_CODES: dict[type[drf_exceptions.APIException], str] = {
    drf_exceptions.NotAuthenticated: ErrorCode.UNAUTHORIZED,
    drf_exceptions.AuthenticationFailed: ErrorCode.UNAUTHORIZED,
    drf_exceptions.PermissionDenied: ErrorCode.PERMISSION_DENIED,
    drf_exceptions.NotFound: ErrorCode.NOT_FOUND,
    drf_exceptions.MethodNotAllowed: ErrorCode.METHOD_NOT_ALLOWED,
    drf_exceptions.NotAcceptable: ErrorCode.NOT_ACCEPTABLE,
    drf_exceptions.UnsupportedMediaType: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    drf_exceptions.Throttled: ErrorCode.RATE_LIMITED,
    drf_exceptions.ParseError: ErrorCode.VALIDATION_ERROR,
    drf_exceptions.ValidationError: ErrorCode.VALIDATION_ERROR,
}


def _api_exception_response(exc: drf_exceptions.APIException) -> Response:
    code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), ErrorCode.INTERNAL_ERROR)
    headers: dict[str, str] = {}
    if isinstance(exc, drf_exceptions.ValidationError):
        message = "Request validation failed"
        details = _flatten_validation(exc.detail)
    elif isinstance(exc, drf_exceptions.ParseError):
        message = "Malformed request body"
        details = [ErrorDetail(field=None, code="PARSE_ERROR", message=str(exc.detail))]
    else:
        message = str(exc.detail)
        details = []
    if isinstance(exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed):
        headers["WWW-Authenticate"] = 'Bearer realm="ragservice"'
    wait = getattr(exc, "wait", None)
    if isinstance(exc, drf_exceptions.Throttled) and wait is not None:
        headers["Retry-After"] = str(max(1, math.ceil(wait)))
    return Response(error_body(code, message, details), status=exc.status_code, headers=headers)


# 数据库不可达时建议客户端多久后重试（秒）：内嵌或托管 PostgreSQL 重启通常在几秒内完成
DATABASE_RETRY_AFTER_SECONDS = 5


def is_database_unavailable(exc: BaseException) -> bool:
    """连接层的数据库错误（服务器停止、重启中、连接被断开）：对调用方是暂时性的，应答 503 而不是 500。

    Django 把驱动异常包装成 ``django.db.OperationalError`` / ``InterfaceError``；
    建立连接之前（如连接池、健康检查）也可能直接冒出 psycopg 的同名异常，一并识别。
    """
    return isinstance(exc, OperationalError | InterfaceError | psycopg.OperationalError | psycopg.InterfaceError)


def database_unavailable() -> ApplicationError:
    """数据库不可达的 503：消息固定，绝不带驱动报错原文（里面有主机、socket 路径等内部信息）。"""
    return ApplicationError(
        ErrorCode.SERVICE_UNAVAILABLE, "The database is temporarily unavailable; retry later", 503,
        [ErrorDetail(None, "DATABASE_UNAVAILABLE", "The database cannot be reached")],
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
    )


def log_internal_error(request: HttpRequest | None, exc: BaseException) -> None:
    """500 的完整信息只进日志：堆栈、请求方法与路径、查询参数与请求体（截断）。"""
    params: dict[str, Any] = {}
    if request is not None:
        params = {"method": request.method, "path": request.path, "query": request.GET.dict()}
        try:
            params["body"] = request.body[:2048].decode("utf-8", "replace")
        except Exception:  # 流已被读取等情况下拿不到请求体，不影响记录其余信息
            params["body"] = None
    logger.error("unhandled_exception", exc_info=exc, **params)


def log_request_exception(sender: object, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """got_request_exception 信号的接收者：记录当前正在处理的异常。"""
    exc = sys.exc_info()[1]
    if exc is not None and is_database_unavailable(exc):
        logger.warning("database_unavailable", exc_info=exc, path=getattr(request, "path", None))
    elif exc is not None:
        log_internal_error(request, exc)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF 的 EXCEPTION_HANDLER：所有异常都渲染为统一错误格式，并回滚当前事务。"""
    # 延迟导入：rest_framework.views 在导入时会加载鉴权类，而鉴权类依赖本模块
    from rest_framework.views import set_rollback

    set_rollback()
    if isinstance(exc, RequestDataTooBig):
        exc = request_too_large()
    elif isinstance(exc, SuspiciousOperation):
        # 表单字段或文件个数超限（TooManyFieldsSent / TooManyFilesSent）等：客户端的请求有问题
        exc = drf_exceptions.ParseError(str(exc))
    if isinstance(exc, ApplicationError):
        return Response(error_body(exc.code, exc.message, exc.details), status=exc.status, headers=dict(exc.headers))
    if isinstance(exc, drf_exceptions.APIException):
        return _api_exception_response(exc)
    if isinstance(exc, Http404):
        return _api_exception_response(drf_exceptions.NotFound())
    if isinstance(exc, PermissionDenied):
        return _api_exception_response(drf_exceptions.PermissionDenied())
    request = context.get("request")
    if is_database_unavailable(exc):
        logger.warning("database_unavailable", exc_info=exc, path=getattr(request, "path", None))
        return exception_handler(database_unavailable(), context)
    log_internal_error(getattr(request, "_request", request), exc)
    return Response(
        error_body(ErrorCode.INTERNAL_ERROR, "Internal server error"),
        status=500,
    )


# ---------------------------------------------------------------- Django 层（非 DRF 视图）的处理器


def json_error_response(status: int, code: str, message: str, details: Sequence[ErrorDetail] = (),
                        headers: Mapping[str, str] | None = None) -> JsonResponse:
    """DRF 之外（Django 处理器、中间件）的统一错误响应。"""
    return JsonResponse(error_body(code, message, details), status=status, headers=headers,
                        json_dumps_params={"ensure_ascii": False})


def handler404(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """未知路由。"""
    return json_error_response(404, ErrorCode.NOT_FOUND, f"No route matches {request.path}")


def handler400(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """Django 层的请求错误（如非法 Host 头、非 DRF 视图里超限的请求体）。"""
    if isinstance(exception, RequestDataTooBig):
        error = request_too_large()
        return json_error_response(error.status, error.code, error.message, error.details)
    return json_error_response(400, ErrorCode.VALIDATION_ERROR, "Bad request")


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django 层的拒绝（如 CSRF 校验失败）。管理后台与检索调试页给人看，用 Django 的 HTML 403 页。"""
    if not is_api_path(request.path):
        return permission_denied(request, exception or PermissionDenied())
    return json_error_response(403, ErrorCode.PERMISSION_DENIED, "Forbidden")


def handler500(request: HttpRequest) -> JsonResponse:
    """中间件或非 DRF 视图（管理后台、检索调试页）里的未处理异常；堆栈已由 got_request_exception 的接收者记录。

    Django 在处理异常的 except 块里调用本函数，``sys.exc_info()`` 仍是那个异常：数据库不可达时答 503。
    """
    exc = sys.exc_info()[1]
    if exc is not None and is_database_unavailable(exc):
        error = database_unavailable()
        return json_error_response(error.status, error.code, error.message, error.details, error.headers)
    return json_error_response(500, ErrorCode.INTERNAL_ERROR, "Internal server error")
