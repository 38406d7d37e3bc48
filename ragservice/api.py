"""API 层与管理后台共用的小部件：严格的输入序列化器、分页参数、错误响应的 OpenAPI 描述。"""

from __future__ import annotations

from typing import Any

from django.conf import settings
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


class PageQuerySerializer(StrictSerializer):
    """page 从 1 开始；page_size 上限由 RAG_MAX_PAGE_SIZE 决定。"""

    page = serializers.IntegerField(min_value=1, default=1)
    page_size = serializers.IntegerField(min_value=1, default=20)

    def validate_page_size(self, value: int) -> int:
        if value > settings.MAX_PAGE_SIZE:
            raise serializers.ValidationError(f"Ensure this value is less than or equal to {settings.MAX_PAGE_SIZE}.")
        return value


def parse_status_list(value: str, allowed: list[str]) -> list[str]:
    """``status=a,b`` 形式的查询参数：逗号分隔，每个都必须是允许的状态。"""
    statuses = [s.strip() for s in value.split(",") if s.strip()]
    invalid = [s for s in statuses if s not in allowed]
    if invalid or not statuses:
        raise serializers.ValidationError(
            f"Unknown status {', '.join(invalid) or value!r}; expected one or more of: {', '.join(allowed)}."
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
    """为 extend_schema 生成一组统一错误格式的响应声明（总是包含 400/401，以及数据库暂时不可达时的 503）。"""
    wanted = sorted({400, 401, 503, *statuses})
    return {status: OpenApiResponse(ERROR_SCHEMA, description="统一错误格式") for status in wanted}
