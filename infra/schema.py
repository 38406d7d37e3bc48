"""drf-spectacular 扩展：把 API key 鉴权声明为 OpenAPI 的 Bearer 安全方案（Swagger UI 可直接填 key），
以及让 schema 与服务端一样严格的 AutoSchema。"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers

from infra.api import StrictSerializer


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "ops.auth.ApiKeyAuthentication"
    name = "ApiKeyAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer <API key>"}


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


# OpenAPI links：一个操作的响应里的 id 可以喂给哪些后续操作。给客户端生成器与 schemathesis 的
# 有状态测试用（创建知识库 → 上传文档 → 查文档 → 删除知识库 → 查清理任务……）
_KB_FROM_BODY = {"kb_id": "$response.body#/id"}
_LINKS: dict[tuple[str, str], dict[str, dict[str, str]]] = {
    ("create_knowledge_base", "201"): {
        operation: _KB_FROM_BODY for operation in (
            "get_knowledge_base", "update_knowledge_base", "delete_knowledge_base", "list_documents",
            "upload_document", "list_items", "upsert_item", "bulk_upsert_items", "list_domains", "sync_domain",
        )
    },
    ("upload_document", "202"): {
        operation: {"document_id": "$response.body#/document_id"}
        for operation in ("get_document", "delete_document", "reindex_document")
    },
    ("delete_knowledge_base", "202"): {
        operation: {"task_id": "$response.body#/cleanup_task_id"}
        for operation in ("get_cleanup_task", "retry_cleanup_task")
    },
    **{
        ("upsert_item", status): {
            operation: {"kb_id": "$request.path.kb_id", "external_id": "$request.path.external_id"}
            for operation in ("get_item", "delete_item")
        }
        for status in ("200", "201", "202")
    },
}


def add_links(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular 的后处理钩子：按 ``_LINKS`` 给响应加上 ``links``。"""
    operations = {operation["operationId"]: operation for path in result.get("paths", {}).values()
                  for operation in path.values() if isinstance(operation, dict) and "operationId" in operation}
    for (source, status), targets in _LINKS.items():
        response = operations[source]["responses"][status]
        response["links"] = {
            target: {"operationId": target, "parameters": parameters} for target, parameters in targets.items()
        }
    return result
