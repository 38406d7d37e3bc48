"""API 层与管理后台共用的小部件：严格的输入序列化器、分页参数、错误响应的 OpenAPI 描述。"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers


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


# DRF 的 CharField 一律拒绝 NUL 与代理对码位；trim_whitespace 且不允许空白的字段还拒绝全是空白的值。
# 正则按 Python re 的语义书写（\s 即 str.isspace），与 DRF 的 str.strip() 判定一致
_TEXT = r"[^\x00\ud800-\udfff]"
NO_NUL_PATTERN = rf"^{_TEXT}*$"
NOT_BLANK_PATTERN = rf"^{_TEXT}*[^\s\x00\ud800-\udfff]{_TEXT}*$"


class StrictAutoSchema(AutoSchema):
    """OpenAPI schema 与服务端一样严格：拒绝未知字段的请求体声明 ``additionalProperties: false``，
    字符串字段用 pattern 写明服务端拒绝的字符（NUL、代理对、全空白），枚举与上下限由字段本身给出。

    只改请求方向：响应由服务端生成，不需要这些约束。
    """

    def _map_serializer(self, serializer: Any, direction: str, bypass_extensions: bool = False) -> dict[str, Any]:
        schema: dict[str, Any] = super()._map_serializer(serializer, direction, bypass_extensions)
        if direction == "request" and isinstance(serializer, StrictSerializer):
            schema["additionalProperties"] = False
        return schema

    def _map_serializer_field(self, field: Any, direction: str, bypass_extensions: bool = False) -> dict[str, Any]:
        schema: dict[str, Any] = super()._map_serializer_field(field, direction, bypass_extensions)
        if (direction == "request" and isinstance(field, serializers.CharField) and schema.get("type") == "string"
                and "format" not in schema and "enum" not in schema):
            blank_rejected = not field.allow_blank and field.trim_whitespace
            schema.setdefault("pattern", getattr(field, "pattern", None)
                              or (NOT_BLANK_PATTERN if blank_rejected else NO_NUL_PATTERN))
        return schema


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
    """为 extend_schema 生成一组统一错误格式的响应声明（总是包含 400/401）。"""
    wanted = sorted({400, 401, *statuses})
    return {status: OpenApiResponse(ERROR_SCHEMA, description="统一错误格式") for status in wanted}
