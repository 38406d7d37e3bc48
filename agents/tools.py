"""MCP 工具：定义（名称、中文说明、JSON Schema）与执行，stdio 与 HTTP 两种传输共用。

工具直接调用服务层，鉴权沿用 API key 的作用域（:class:`infra.principal.Principal`）：作用域外的知识库、
只读 key 的写操作都得到与 HTTP API 相同的错误码。工具自身的错误放在结果里（``isError: true``，
内容是错误契约的 error 对象），让模型看得到并自行纠正，而不是协议层错误。
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import structlog
from rest_framework import serializers

from documents import items as item_services
from documents import selectors as document_selectors
from documents.api.item_serializers import ItemListQuerySerializer, ItemWriteSerializer, item_input, item_payload
from documents.api.serializers import DocumentSerializer
from infra.errors import ApplicationError, ErrorCode, ErrorDetail, error_body, validation_error
from infra.principal import Principal
from knowledge.api.serializers import KnowledgeBaseSerializer
from knowledge.selectors import knowledge_base_list, usable_knowledge_base
from search import services as search_services
from search.api.serializers import SearchRequestSerializer
from search.api.views import result_payload

logger = structlog.get_logger(__name__)

SERVER_NAME = "ragservice"
INSTRUCTIONS = ("ragservice 知识库：先用 list_knowledge_bases 找到知识库 id，再用 search_knowledge 检索"
                "（给 query 做语义 + 全文检索；不给 query 按 domain/category/tags 列出条目）。"
                "用 upsert_knowledge_item 按外部 id 写入知识（内容没变不做任何工作），delete_knowledge_item 删除。")

_KB_ID = {"type": "string", "description": "知识库 id（UUID），可用 list_knowledge_bases 查到"}
_TAGS = {"type": "array", "items": {"type": "string"}, "description": "标签"}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: Callable[[Principal, dict[str, Any]], Any]

    def definition(self) -> types.Tool:
        return types.Tool(name=self.name, description=self.description, input_schema=self.input_schema)


def _validated(serializer: serializers.Serializer) -> dict[str, Any]:
    if not serializer.is_valid():
        raise validation_error(serializer.errors)
    return dict(serializer.validated_data)


def _search_knowledge(principal: Principal, args: dict[str, Any]) -> dict[str, Any]:
    kb_id = args.get("knowledge_base_id", "")
    query = args.get("query")
    top_k = args.get("top_k", 5)
    if query:
        filters = {key: value for key, value in (("domain", args.get("domain")), ("category", args.get("category")),
                                                 ("tags_any", args.get("tags"))) if value}
        body = SearchRequestSerializer(data={"query": query, "knowledge_base_id": kb_id, "top_k": top_k,
                                             "filters": filters})
        _validated(body)
        kb = search_services.searchable_knowledge_base(principal=principal, kb_id=kb_id)
        outcome = search_services.search(kb, body.to_request())
        return {"results": [result_payload(result) for result in outcome.results], "degraded": outcome.degraded}
    kb = usable_knowledge_base(principal=principal, kb_id=kb_id, write=False)
    params = ItemListQuerySerializer(data={"page_size": top_k, **{
        key: value for key, value in (("domain", args.get("domain")), ("category", args.get("category")),
                                      ("tags_any", ",".join(args.get("tags") or []))) if value}})
    _validated(params)
    found, total = document_selectors.item_list(kb=kb, filters=params.filters(), page=1, page_size=top_k)
    return {"items": [item_payload(d) for d in found], "total": total}


def _list_knowledge_bases(principal: Principal, args: dict[str, Any]) -> dict[str, Any]:
    found, total = knowledge_base_list(principal=principal, page=1, page_size=100,
                                       name_contains=args.get("name_contains") or None)
    return {"knowledge_bases": KnowledgeBaseSerializer(found, many=True).data, "total": total}


def _upsert_knowledge_item(principal: Principal, args: dict[str, Any]) -> dict[str, Any]:
    external_id = str(args.get("external_id") or "")
    if not external_id:
        raise ApplicationError(ErrorCode.VALIDATION_ERROR, "Request validation failed", 400,
                               [ErrorDetail("external_id", "REQUIRED", "This field is required.")])
    kb = usable_knowledge_base(principal=principal, kb_id=args.get("knowledge_base_id", ""), write=True)
    fields = {k: v for k, v in args.items() if k not in ("knowledge_base_id", "external_id")}
    data = _validated(ItemWriteSerializer(data=fields))
    result = item_services.item_upsert(kb=kb, item=item_input(data, external_id))
    assert result.document is not None
    return {"result": result.result, "chunks_embedded": result.chunks_embedded,
            "chunks_reused": result.chunks_reused, "item": item_payload(result.document)}


def _delete_knowledge_item(principal: Principal, args: dict[str, Any]) -> dict[str, Any]:
    kb = usable_knowledge_base(principal=principal, kb_id=args.get("knowledge_base_id", ""), write=True)
    item_services.item_delete(kb=kb, external_id=str(args.get("external_id") or ""))
    return {"deleted": True}


def _get_document_status(principal: Principal, args: dict[str, Any]) -> dict[str, Any]:
    document = document_selectors.document_get(principal=principal, document_id=str(args.get("document_id") or ""))
    return dict(DocumentSerializer(document).data)


TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in (
    ToolSpec(
        "search_knowledge",
        "在知识库中检索知识。给 query 时做语义 + 全文混合检索，按相关度降序返回最相关的分块（含 score 与元数据）；"
        "不给 query 时按 domain / category / tags 过滤列出知识条目。过滤条件之间是“且”，tags 匹配任一标签。",
        {"type": "object", "properties": {
            "knowledge_base_id": _KB_ID,
            "query": {"type": "string", "description": "自然语言查询；留空则只按元数据过滤"},
            "domain": {"type": "string", "description": "只看这个领域（domain）"},
            "category": {"type": "string", "description": "只看这个分类（category）"},
            "tags": {**_TAGS, "description": "含其中任一标签"},
            "top_k": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5, "description": "返回条数，默认 5"},
        }, "required": ["knowledge_base_id"]},
        _search_knowledge,
    ),
    ToolSpec(
        "list_knowledge_bases",
        "列出当前 API key 可访问的知识库（id、名称、描述、状态、embedding 模型）。",
        {"type": "object", "properties": {
            "name_contains": {"type": "string", "description": "名称包含（不区分大小写）"},
        }},
        _list_knowledge_bases,
    ),
    ToolSpec(
        "upsert_knowledge_item",
        "按外部 id 写入一条知识（新建或更新）。内容与元数据都没变时不做任何工作（result=unchanged）；"
        "变了只重新计算文本变了的分块。很长的条目会排队处理（result=queued），旧版本在此期间照常可检索。",
        {"type": "object", "properties": {
            "knowledge_base_id": _KB_ID,
            "external_id": {"type": "string", "description": "条目的外部 id，同一知识库内唯一"},
            "content": {"type": "string", "description": "正文（Markdown 或纯文本）"},
            "title": {"type": "string", "description": "标题"},
            "domain": {"type": "string", "description": "领域"},
            "category": {"type": "string", "description": "分类"},
            "tags": _TAGS,
            "metadata": {"type": "object", "description": "其他元数据（JSON 标量或列表），会复制到每个分块"},
        }, "required": ["knowledge_base_id", "external_id", "content"]},
        _upsert_knowledge_item,
    ),
    ToolSpec(
        "delete_knowledge_item",
        "按外部 id 删除一条知识；它的分块立即从检索结果中消失。",
        {"type": "object", "properties": {
            "knowledge_base_id": _KB_ID,
            "external_id": {"type": "string", "description": "条目的外部 id"},
        }, "required": ["knowledge_base_id", "external_id"]},
        _delete_knowledge_item,
    ),
    ToolSpec(
        "get_document_status",
        "查询上传文档的摄取状态（processing / completed / failed）、分块数与失败原因。",
        {"type": "object", "properties": {
            "document_id": {"type": "string", "description": "上传时返回的 document_id"},
        }, "required": ["document_id"]},
        _get_document_status,
    ),
)}


def tool_definitions() -> list[types.Tool]:
    return [spec.definition() for spec in TOOLS.values()]


def call_tool(principal: Principal, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
    """执行一个工具（同步，调用方负责放到合适的线程）。业务错误放进结果（isError），未知工具同样如此。"""
    spec = TOOLS.get(name)
    try:
        if spec is None:
            raise ApplicationError(ErrorCode.NOT_FOUND, f"Unknown tool '{name}'", 404,
                                   [ErrorDetail("name", "NOT_FOUND", f"Available tools: {', '.join(TOOLS)}")])
        payload = spec.run(principal, dict(arguments or {}))
    except ApplicationError as exc:
        logger.info("mcp_tool_error", tool=name, code=exc.code)
        body = error_body(exc.code, exc.message, exc.details)
        return types.CallToolResult(content=[types.TextContent(type="text", text=_json(body))],
                                    structured_content=body, is_error=True)
    structured = json.loads(_json(payload))
    logger.info("mcp_tool_called", tool=name)
    return types.CallToolResult(content=[types.TextContent(type="text", text=_json(structured))],
                                structured_content=structured)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
