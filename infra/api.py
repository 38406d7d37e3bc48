"""API 层与管理后台共用的小部件：严格的输入序列化器、分页参数、错误响应的 OpenAPI 描述。"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers
from rest_framework.parsers import JSONParser

from infra.errors import ApplicationError, ErrorCode, ErrorDetail

# JSON 嵌套层数上限：真实请求（过滤条件、元数据、分块参数）不超过三四层；不设上限时
# 十万个 "[" 会在解析或之后任何递归处理里触发 RecursionError
MAX_JSON_DEPTH = 32


class JsonTooDeepError(ValueError):
    """JSON 嵌套超过 MAX_JSON_DEPTH 层。"""


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """非递归地检查嵌套层数（标量 0 层，``[]`` 与 ``{}`` 1 层）。"""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, Mapping) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def json_has_nul(value: Any) -> bool:
    """任何一层的字符串值或对象键里有 NUL（``\\u0000``）：PostgreSQL 的 jsonb 与 text 都存不了它，
    必须在入口就拒绝，否则会在写库时变成 500（元数据是自由结构，字段级校验管不到嵌套的键）。"""
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return True
        elif isinstance(node, Mapping):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def json_has_nul_error(field: str | None) -> ApplicationError:
    return ApplicationError(
        ErrorCode.VALIDATION_ERROR, "Request validation failed", 400,
        [ErrorDetail(field, "NUL_CHARACTER", "JSON strings and keys must not contain NUL (\\u0000)")],
    )


def json_loads_bounded(text: str | bytes) -> Any:
    """``json.loads`` 加嵌套层数上限。C 解码器在约 1000 层时抛 RecursionError（便宜且干净），
    这里把它与超过 MAX_JSON_DEPTH 的结果一并换成 :class:`JsonTooDeepError`。"""
    try:
        value = json.loads(text)
    except RecursionError as exc:
        raise JsonTooDeepError from exc
    if json_depth_exceeds(value):
        raise JsonTooDeepError
    return value


def json_too_deep(field: str | None) -> ApplicationError:
    return ApplicationError(
        ErrorCode.VALIDATION_ERROR, "Request validation failed", 400,
        [ErrorDetail(field, "NESTING_TOO_DEEP", f"JSON nesting must not exceed {MAX_JSON_DEPTH} levels")],
    )


class BoundedJSONParser(JSONParser):
    """DRF 的 JSON 解析器加嵌套层数上限；请求体大小由 Django 的 DATA_UPLOAD_MAX_MEMORY_SIZE 限制
    （超限抛 RequestDataTooBig，统一渲染为 413）。"""

    def parse(self, stream: IO[Any], media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        try:
            value = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise json_too_deep(None) from exc
        if json_depth_exceeds(value):
            raise json_too_deep(None)
        if json_has_nul(value):
            raise json_has_nul_error(None)
        return value


class StrictSerializer(serializers.Serializer):
    """拒绝未知字段：拼错的字段名应当得到 400，而不是被静默忽略。"""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class SettingBoundedIntegerField(serializers.IntegerField):
    """上限取自某个 settings 项的整数字段（如 RAG_MAX_PAGE_SIZE）。

    DRF 每次实例化序列化器都会用原参数重新构造字段，所以上限在那一刻读取：改了设置（包括测试里的
    ``settings`` 夹具）既影响校验，也影响 OpenAPI schema 里的 ``maximum``，两者不会不一致。
    """

    def __init__(self, *, setting: str, **kwargs: Any) -> None:
        super().__init__(max_value=getattr(settings, setting), **kwargs)


# page 的上限：OFFSET = (page-1)*page_size 必须远小于 bigint，且没有人真的翻到第一百万页
MAX_PAGE = 1_000_000


class PageQuerySerializer(StrictSerializer):
    """page 从 1 开始，上限 MAX_PAGE；page_size 上限由 RAG_MAX_PAGE_SIZE 决定。"""

    page = serializers.IntegerField(min_value=1, max_value=MAX_PAGE, default=1)
    page_size = SettingBoundedIntegerField(setting="MAX_PAGE_SIZE", min_value=1, default=20)


class StatusListField(serializers.CharField):
    """``status=a,b`` 形式的查询参数：逗号分隔，每项去掉首尾空白后必须是允许的状态。

    schema 里用同样规则的正则描述（见 :meth:`pattern`），生成的请求与服务端的判定一致。
    """

    def __init__(self, *, allowed: list[str], **kwargs: Any) -> None:
        self.allowed = list(allowed)
        super().__init__(**kwargs)

    @property
    def pattern(self) -> str:
        one = "(?:" + "|".join(re.escape(value) for value in self.allowed) + ")"
        return rf"^\s*{one}\s*(?:,\s*{one}\s*)*$"

    def to_internal_value(self, data: Any) -> list[str]:  # type: ignore[override]
        value = super().to_internal_value(data)
        statuses = [part.strip() for part in value.split(",")]
        invalid = [s for s in statuses if s not in self.allowed]
        if invalid:
            raise serializers.ValidationError(
                f"Unknown status {', '.join(map(repr, invalid))}; expected one or more of: {', '.join(self.allowed)}."
            )
        return statuses


def page_response(serializer_class: type[serializers.Serializer], name: str) -> serializers.Serializer:
    """列表响应：``{items, total, page, page_size}``。"""
    return inline_serializer(
        name,
        {
            "items": serializer_class(many=True),
            "total": serializers.IntegerField(),
            "page": serializers.IntegerField(),
            "page_size": serializers.IntegerField(),
        },
    )


ERROR_SCHEMA = inline_serializer(
    "ErrorResponse",
    {
        "error": inline_serializer(
            "ErrorBody",
            {
                "code": serializers.CharField(),
                "message": serializers.CharField(),
                "request_id": serializers.UUIDField(),
                "details": inline_serializer(
                    "ErrorDetail",
                    {
                        "field": serializers.CharField(allow_null=True),
                        "code": serializers.CharField(),
                        "message": serializers.CharField(),
                    },
                    many=True,
                ),
            },
        )
    },
)


def error_responses(*statuses: int) -> dict[int, OpenApiResponse]:
    """为 extend_schema 生成一组统一错误格式的响应声明。

    总是包含：400/401；任何请求都可能碰到的 414（URL 过长）、431（请求头过大）与 429（限流）；数据库暂时不可达时的 503。
    """
    wanted = sorted({400, 401, 414, 429, 431, 503, *statuses})
    return {status: OpenApiResponse(ERROR_SCHEMA, description="统一错误格式") for status in wanted}
