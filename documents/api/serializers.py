"""文档 API 的输入输出序列化器。"""

from __future__ import annotations

import json
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from documents.models import Document
from infra.api import (
    MAX_JSON_DEPTH,
    JsonTooDeepError,
    PageQuerySerializer,
    StatusListField,
    StrictSerializer,
    json_has_nul,
    json_loads_bounded,
)


@extend_schema_field(OpenApiTypes.STR)
class _JsonObjectField(serializers.Field):
    """multipart 表单里的 JSON 对象字段（字符串形式）。"""

    default_error_messages = {"invalid": "Must be a JSON object.",
                              "nesting_too_deep": f"JSON nesting must not exceed {MAX_JSON_DEPTH} levels.",
                              "nul": "JSON strings and keys must not contain NUL (\\u0000)."}

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict):
            return data
        try:
            value = json_loads_bounded(data)
        except JsonTooDeepError:
            self.fail("nesting_too_deep")
        except (TypeError, ValueError):
            self.fail("invalid")
        if not isinstance(value, dict):
            self.fail("invalid")
        if json_has_nul(value):
            self.fail("nul")
        return value

    def to_representation(self, value: Any) -> Any:
        return value


class DocumentMetadataField(_JsonObjectField):
    """title/domain/category 为字符串，tags 为字符串列表，其余自由键须是 JSON 标量或列表。"""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        errors = []
        for key in ("title", "domain", "category"):
            if key in value and not isinstance(value[key], str):
                errors.append(f"'{key}' must be a string")
        tags = value.get("tags")
        if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
            errors.append("'tags' must be a list of strings")
        if len(json.dumps(value, ensure_ascii=False)) > 16_384:
            errors.append("metadata must be at most 16 KiB of JSON")
        if errors:
            raise serializers.ValidationError(errors)
        return value


class DocumentUploadSerializer(StrictSerializer):
    file = serializers.FileField(allow_empty_file=True, help_text="文档文件（multipart 字段 file）")
    metadata = DocumentMetadataField(required=False, help_text='JSON 对象，如 {"title": "…", "tags": ["招标"]}')
    chunking = _JsonObjectField(required=False, help_text='覆盖知识库的分块参数，如 {"strategy": "semantic"}')


class DocumentListQuerySerializer(PageQuerySerializer):
    status = StatusListField(allowed=Document.Status.values, required=False,
                             help_text="逗号分隔的状态，如 failed,processing")


class DocumentAcceptedSerializer(serializers.Serializer):
    document_id = serializers.UUIDField()
    knowledge_base_id = serializers.UUIDField()
    filename = serializers.CharField()
    status = serializers.CharField()


class DocumentSerializer(serializers.ModelSerializer):
    knowledge_base_id = serializers.UUIDField()
    error_message = serializers.SerializerMethodField()

    class Meta:
        model = Document
        fields = ["id", "knowledge_base_id", "filename", "status", "error_message", "chunk_count", "created_at",
                  "updated_at", "metadata", "format", "size_bytes", "ocr_skipped", "ocr_engine", "stage_timings",
                  "stage", "attempts", "next_retry_at", "reindex_status", "finished_at"]

    def get_error_message(self, obj: Document) -> str | None:
        return obj.error_message or None
