"""drf-spectacular 扩展：把 API key 鉴权声明为 OpenAPI 的 Bearer 安全方案（Swagger UI 可直接填 key），
以及让 schema 与服务端一样严格的 AutoSchema。"""

from __future__ import annotations

import copy
import re
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers

from infra.api import WHITESPACE_CLASS, OneOrManyField, StrictSerializer


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "ops.auth.ApiKeyAuthentication"
    name = "ApiKeyAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer <API key>"}


# DRF 的 CharField 一律拒绝 NUL 与代理对码位；trim_whitespace 且不允许空白的字段还拒绝全是空白的值。
# 空白按 str.strip() 的口径（显式字符类，见 WHITESPACE_CLASS）。pattern 只用各家正则引擎都认得的写法：
# 代理对码位不写进去——Rust 的 regex（schemathesis 用的 jsonschema-rs、许多代码生成器）根本编译不了
# \ud800-\udfff，整条 pattern 因此被忽略；落单的代理对也不是合法的 Unicode 文本，服务端照样拒绝
NO_NUL_PATTERN = r"^[^\x00]*$"
NOT_BLANK_PATTERN = rf"^[^\x00]*[^\x00{WHITESPACE_CLASS}][^\x00]*$"


# drf-spectacular 给带 pattern/format 且允许空串的字符串字段生成 ``oneOf: [原 schema, 空串]``
_BLANK_BRANCH = {"type": "string", "maxLength": 0}
# 描述性的键留在外层，约束放进分支（与 drf-spectacular 的拆法一致）
_OUTER_KEYS = ("description", "title", "readOnly", "writeOnly", "nullable", "deprecated", "default")


def _accepts_blank(schema: dict[str, Any]) -> bool:
    """字符串 schema 是否本来就接受空串（pattern 按 Python re 的语义书写，见上）。"""
    if schema.get("type") != "string" or "format" in schema or "enum" in schema or schema.get("minLength", 0) > 0:
        return False
    pattern = schema.get("pattern")
    return pattern is None or re.search(pattern, "") is not None


class StrictAutoSchema(AutoSchema):
    """OpenAPI schema 与服务端一样严格，也一样宽松——按 schema 生成的请求，服务端的判定与 schema 一致：

    * 拒绝未知字段的请求体声明 ``additionalProperties: false``；
    * 字符串字段用 pattern 写明服务端拒绝的字符（NUL、全空白；代理对见 NO_NUL_PATTERN 上的说明），
      枚举与上下限由字段本身给出；
    * 不许为空的数组（``allow_empty=False``）写明 ``minItems: 1``；
    * 允许空串的字符串不用 drf-spectacular 的 ``oneOf: [原 schema, 空串]``：空串同时满足两个分支时
      oneOf 不成立，schema 反而拒绝了服务端接受的空串。原 schema 本来就接受空串时直接合并，否则改成 anyOf；
    * “单个值或数组”的字段（:class:`infra.api.OneOrManyField`）写成 ``anyOf: [单个值, 数组]``。

    值的 JSON 类型由服务端同样严格地检查（:class:`infra.api.StrictSerializer`）。
    pattern 等约束只加在请求方向：响应由服务端生成，不需要这些约束。
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
            blank_rejected = not field.allow_blank and (field.trim_whitespace
                                                        or getattr(field, "rejects_blank_text", False))
            schema.setdefault("pattern", getattr(field, "pattern", None)
                              or (NOT_BLANK_PATTERN if blank_rejected else NO_NUL_PATTERN))
        return schema

    def _insert_field_validators(self, field: Any, schema: dict[str, Any]) -> None:
        # 上下限、长度等由字段的校验器写入；这里在那之后改写组合结构（见类的说明）
        super()._insert_field_validators(field, schema)
        branches = schema.get("oneOf")
        if isinstance(branches, list) and len(branches) == 2 and branches[1] == _BLANK_BRANCH:
            if _accepts_blank(branches[0]):
                del schema["oneOf"]
                schema.update(branches[0])
            else:
                schema["anyOf"] = schema.pop("oneOf")
        if (isinstance(field, serializers.ListField) and not field.allow_empty and schema.get("type") == "array"
                and schema.get("minItems", 0) < 1):
            schema["minItems"] = 1
        if isinstance(field, OneOrManyField) and schema.get("type") == "array":
            outer = {key: schema.pop(key) for key in _OUTER_KEYS if key in schema}
            many = dict(schema)
            schema.clear()
            schema.update({"anyOf": [copy.deepcopy(many["items"]), many], **outer})


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
