"""知识条目与 domain 同步 API 的输入输出序列化器。"""

from __future__ import annotations

import json
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from documents.filters import SearchFilters
from documents.items import ITEM_FIELDS, ItemInput, ItemResult
from documents.models import Document
from infra.api import PageQuerySerializer, SettingBoundedListField, StrictSerializer, VerbatimTextField
from infra.errors import error_body

_RESERVED = {*ITEM_FIELDS, "external_id"}


@extend_schema_field({
    "type": "object",
    # 条目的顶层字段不能再写进 metadata（服务端 400）：schema 里这些键的值 ``not: {}``，即这个键不能出现
    # （schemathesis 在 PG15 的一次运行里造出 metadata 带 "title": null 的条目，schema 允许、服务端拒绝）
    "properties": {key: {"not": {}} for key in sorted(_RESERVED)},
    "additionalProperties": {},
})
class ItemMetadataField(serializers.DictField):
    """条目的自由元数据：不能含条目的顶层字段名，整体至多 16 KiB 的 JSON。规则与上面的 schema 在同一处。"""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        reserved = sorted(_RESERVED & set(value))
        if reserved:
            raise serializers.ValidationError(f"Use the top-level fields instead of metadata keys: {reserved}")
        if len(json.dumps(value, ensure_ascii=False)) > 16_384:
            raise serializers.ValidationError("metadata must be at most 16 KiB of JSON")
        return value


class ItemWriteSerializer(StrictSerializer):
    """PUT 的请求体；external_id 在路径里。"""

    content = VerbatimTextField(max_length=1_000_000, help_text="正文（Markdown 或纯文本），不能全是空白")
    title = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")
    domain = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    category = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    tags = serializers.ListField(child=serializers.CharField(max_length=255), max_length=100, required=False,
                                 default=list)
    metadata = ItemMetadataField(required=False, default=dict,
                                 help_text="自由键（JSON 标量或列表），复制到每个分块；不能含 title、domain、category、"
                                           "tags、external_id（它们是顶层字段）")




class ItemEntrySerializer(ItemWriteSerializer):
    """批量写入与 domain 同步里的一个条目：带 external_id。"""

    external_id = serializers.CharField(max_length=255)


def item_input(data: dict[str, Any], external_id: str | None = None) -> ItemInput:
    """校验后的数据 → 服务层的条目；external_id 取路径参数或条目自身的字段。"""
    return ItemInput(external_id=external_id or data["external_id"], content=data["content"], title=data["title"],
                     domain=data["domain"], category=data["category"], tags=tuple(data["tags"]),
                     metadata=data["metadata"])


class ItemSerializer(serializers.Serializer):
    """条目的完整表示（由 :func:`item_payload` 生成的字典）。"""

    external_id = serializers.CharField()
    document_id = serializers.UUIDField()
    title = serializers.CharField()
    content = serializers.CharField()
    domain = serializers.CharField()
    category = serializers.CharField()
    tags = serializers.ListField(child=serializers.CharField())
    metadata = serializers.DictField()
    status = serializers.ChoiceField(choices=Document.Status.choices,
                                     help_text="completed 才可检索；processing 表示首次写入在排队")
    reindex_status = serializers.CharField(help_text="非空表示有一次更新在排队/运行/失败，期间旧版本照常可检索")
    error_message = serializers.CharField(allow_null=True)
    chunk_count = serializers.IntegerField()
    content_hash = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


def item_payload(document: Document) -> dict[str, Any]:
    metadata = dict(document.metadata)
    fields = {name: metadata.pop(name, [] if name == "tags" else "") for name in ITEM_FIELDS}
    metadata.pop("external_id", None)
    return {
        "external_id": document.external_id, "document_id": document.id, **fields, "content": document.content,
        "metadata": metadata, "status": document.status, "reindex_status": document.reindex_status,
        "error_message": document.error_message or None, "chunk_count": document.chunk_count,
        "content_hash": document.content_hash, "created_at": document.created_at, "updated_at": document.updated_at,
    }


class ItemWriteResultSerializer(serializers.Serializer):
    result = serializers.ChoiceField(choices=["created", "updated", "unchanged", "queued"])
    chunks_embedded = serializers.IntegerField()
    chunks_reused = serializers.IntegerField()
    item = ItemSerializer()


def write_result_payload(result: ItemResult) -> dict[str, Any]:
    assert result.document is not None
    return {"result": result.result, "chunks_embedded": result.chunks_embedded,
            "chunks_reused": result.chunks_reused, "item": item_payload(result.document)}


class ItemBulkSerializer(StrictSerializer):
    # 每个条目在视图里逐条校验（结果逐条给出），这里只要求是对象；至少一条、至多 RAG_ITEM_BULK_MAX 条
    items = SettingBoundedListField(setting="ITEM_BULK_MAX", child=serializers.DictField(), allow_empty=False,
                                    help_text="条目数组，每个同 PUT 的请求体外加 external_id；至少 1 条，"
                                              "上限 RAG_ITEM_BULK_MAX")


class ItemBulkResultSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    external_id = serializers.CharField(allow_null=True)
    result = serializers.ChoiceField(choices=["created", "updated", "unchanged", "failed"])
    document_id = serializers.UUIDField(allow_null=True)
    chunks_embedded = serializers.IntegerField()
    chunks_reused = serializers.IntegerField()
    # 客户端在超时重试后据此判断第一次尝试是否已经写入（见 ragservice_client 的 resent）
    created_at = serializers.DateTimeField(allow_null=True, help_text="条目的创建时间；失败时为 null")
    updated_at = serializers.DateTimeField(allow_null=True, help_text="条目的最近修改时间；失败时为 null")
    error = serializers.DictField(allow_null=True, help_text="失败时为错误契约里的 error 对象")


class ItemBulkResponseSerializer(serializers.Serializer):
    results = ItemBulkResultSerializer(many=True)
    counts = serializers.DictField(child=serializers.IntegerField())


def bulk_result_payload(index: int, result: ItemResult) -> dict[str, Any]:
    error = error_body(result.error.code, result.error.message, result.error.details)["error"] if result.error else None
    document = result.document
    return {"index": index, "external_id": result.external_id, "result": result.result,
            "document_id": document.id if document is not None else None,
            "chunks_embedded": result.chunks_embedded, "chunks_reused": result.chunks_reused,
            "created_at": document.created_at if document is not None else None,
            "updated_at": document.updated_at if document is not None else None, "error": error}


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


class ItemListQuerySerializer(PageQuerySerializer):
    """元数据过滤：字段之间“且”，逗号分隔的多个值“任一”（tags_all 为“全部”）。"""

    domain = serializers.CharField(required=False)
    category = serializers.CharField(required=False)
    tags_any = serializers.CharField(required=False)
    tags_all = serializers.CharField(required=False)

    def filters(self) -> SearchFilters:
        data = self.validated_data
        return SearchFilters(domains=_csv(data.get("domain", "")), categories=_csv(data.get("category", "")),
                             tags_any=_csv(data.get("tags_any", "")), tags_all=_csv(data.get("tags_all", "")))


class DomainSyncSerializer(StrictSerializer):
    version = serializers.CharField(max_length=64, help_text="版本号；与内容摘要都没变时整个 domain 跳过")
    items = serializers.ListField(child=ItemEntrySerializer(),
                                  help_text="该 domain 的全部条目；不在其中的旧条目会被删除")
    dry_run = serializers.BooleanField(default=False, help_text="只返回会发生什么，不写入")


class DomainSyncResultSerializer(serializers.Serializer):
    domain = serializers.CharField()
    version = serializers.CharField()
    skipped = serializers.BooleanField()
    dry_run = serializers.BooleanField()
    created = serializers.IntegerField()
    updated = serializers.IntegerField()
    unchanged = serializers.IntegerField()
    queued = serializers.IntegerField()
    removed = serializers.IntegerField()
    failed = serializers.IntegerField()
    chunks_embedded = serializers.IntegerField()
    chunks_reused = serializers.IntegerField()
    seconds = serializers.FloatField()
    failures = serializers.ListField(child=serializers.CharField(), help_text="失败条目的 id 与原因")
    synced_at = serializers.DateTimeField(
        allow_null=True, help_text="当前版本写入的时间（跳过时是更早那次同步的时间）；dry_run 时为 null")
    last_applied = serializers.DictField(allow_null=True,
                                         help_text="跳过时：写入当前版本的那次同步的统计（超时重试的客户端据此报告"
                                                   "第一次尝试做了什么）；否则为 null")


class DomainSerializer(serializers.Serializer):
    domain = serializers.CharField()
    version = serializers.CharField()
    status = serializers.CharField()
    item_count = serializers.IntegerField()
    content_hash = serializers.CharField()
    stats = serializers.DictField()
    synced_at = serializers.DateTimeField()
