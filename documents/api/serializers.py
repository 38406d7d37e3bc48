"""文档 API 的输入输出序列化器。"""

from __future__ import annotations

import json
from typing import Any

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
from infra.schema import NO_NUL_PATTERN
from knowledge.api.serializers import ChunkingSerializer

# multipart 里以 JSON 文本提交的字段：schema 里是 object（形状见各字段），encoding 写明 contentType，
# 见视图里 upload_document 的 extend_schema
JSON_FORM_ENCODING = {"contentType": "application/json"}


class _JsonObjectField(serializers.Field):
    """multipart 表单里的 JSON 对象字段：值是 JSON 文本，解析出的必须是对象。"""

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


_METADATA_TEXT = {"type": "string", "pattern": NO_NUL_PATTERN}


@extend_schema_field({
    "type": "object",
    "properties": {
        "title": _METADATA_TEXT, "domain": _METADATA_TEXT, "category": _METADATA_TEXT,
        "tags": {"type": "array", "items": _METADATA_TEXT},
    },
    # 其余自由键原样存进文档元数据（并复制到每个分块）
    "additionalProperties": {},
})
class DocumentMetadataField(_JsonObjectField):
    """title/domain/category 为字符串，tags 为字符串列表，其余自由键不限；整体至多 16 KiB 的 JSON。"""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        errors = []
        for key in ("title", "domain", "category"):
            if key in value and not isinstance(value[key], str):
                errors.append(f"'{key}' must be a string")
        tags = value.get("tags", [])
        if not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
            errors.append("'tags' must be a list of strings")
        if len(json.dumps(value, ensure_ascii=False)) > 16_384:
            errors.append("metadata must be at most 16 KiB of JSON")
        if errors:
            raise serializers.ValidationError(errors)
        return value


@extend_schema_field(ChunkingSerializer)
class ChunkingFormField(_JsonObjectField):
    """覆盖知识库分块参数的 JSON 对象：与创建知识库时的 ``chunking`` 同形、同样严格（未知键、错的 JSON 类型 → 400）。"""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        chunking = ChunkingSerializer(data=value)
        if not chunking.is_valid():
            raise serializers.ValidationError(chunking.errors)
        return dict(chunking.validated_data)


class DocumentUploadSerializer(StrictSerializer):
    file = serializers.FileField(allow_empty_file=True, help_text="文档文件（multipart 字段 file）")
    metadata = DocumentMetadataField(
        required=False,
        help_text='JSON 对象（multipart 字段的值是 JSON 文本），如 {"title": "…", "domain": "…", "category": "…", '
                  '"tags": ["招标"]}：title/domain/category 为字符串，tags 为字符串数组，其余键原样保存；至多 16 KiB')
    chunking = ChunkingFormField(
        required=False,
        help_text='JSON 对象（multipart 字段的值是 JSON 文本），覆盖知识库的分块参数，如 {"strategy": "semantic"}；'
                  "键同创建知识库时的 chunking")


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
    # 来自文档最近的作业（jobs.Job）：本轮已开始的尝试次数、等自动重试时的重试时间
    attempts = serializers.IntegerField(read_only=True, min_value=0)
    next_retry_at = serializers.DateTimeField(read_only=True, allow_null=True)

    class Meta:
        model = Document
        fields = ["id", "knowledge_base_id", "filename", "status", "error_message", "chunk_count", "created_at",
                  "updated_at", "metadata", "format", "size_bytes", "ocr_skipped", "ocr_engine", "stage_timings",
                  "stage", "attempts", "next_retry_at", "reindex_status", "finished_at"]

    def get_error_message(self, obj: Document) -> str | None:
        return obj.error_message or None
