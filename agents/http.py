"""MCP 的 streamable HTTP 传输（``/mcp``），由 web 进程直接提供。

无状态、JSON 响应模式：每个 POST 是一条（或一批）JSON-RPC 消息，响应是 ``application/json``；
不发会话 id，也不提供 GET 的 SSE 流（405，规范允许）。这样 gunicorn 的同步 worker 就能服务 MCP，
不需要另起 ASGI 进程。鉴权与 REST API 完全相同：``Authorization: Bearer <API key>``，知识库作用域照旧生效。
消息体与结果都用 ``mcp`` 包的类型构造，与 stdio 传输共用 :mod:`agents.tools`。
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from django.http import HttpResponse, JsonResponse
from drf_spectacular.utils import extend_schema
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from pydantic import BaseModel
from rest_framework.request import Request
from rest_framework.views import APIView

from agents.tools import INSTRUCTIONS, SERVER_NAME, call_tool, tool_definitions
from infra.principal import Principal, request_principal

_METHOD_NOT_FOUND = -32601
_INVALID_REQUEST = -32600


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _initialize(params: dict[str, Any]) -> dict[str, Any]:
    requested = params.get("protocolVersion")
    version = requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
    result = types.InitializeResult(
        protocol_version=version,
        capabilities=types.ServerCapabilities(tools=types.ToolsCapability(list_changed=False)),
        server_info=types.Implementation(name=SERVER_NAME, version="0.1.0"),
        instructions=INSTRUCTIONS,
    )
    return _dump(result)


def _handle(principal: Principal, message: Any) -> dict[str, Any] | None:
    """处理一条 JSON-RPC 消息；通知（没有 id）返回 None。"""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or "method" not in message:
        return {"jsonrpc": "2.0", "id": None, "error": {"code": _INVALID_REQUEST, "message": "Invalid request"}}
    if "id" not in message:
        return None
    method, params = message["method"], message.get("params") or {}
    if method == "initialize":
        result = _initialize(params)
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = _dump(types.ListToolsResult(tools=tool_definitions()))
    elif method == "tools/call":
        result = _dump(call_tool(principal, str(params.get("name", "")), params.get("arguments")))
    else:
        return {"jsonrpc": "2.0", "id": message["id"],
                "error": {"code": _METHOD_NOT_FOUND, "message": f"Method not found: {method}"}}
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


class McpView(APIView):
    """``POST /mcp``：MCP streamable HTTP（无状态、JSON 响应）。"""

    @extend_schema(exclude=True)
    def post(self, request: Request) -> HttpResponse:
        principal = request_principal(request)
        messages = request.data if isinstance(request.data, list) else [request.data]
        replies = [reply for reply in (_handle(principal, m) for m in messages) if reply is not None]
        if not replies:
            return HttpResponse(status=202)  # 只有通知或响应：按规范 202、无响应体
        body: Any = replies if isinstance(request.data, list) else replies[0]
        return JsonResponse(body, safe=False, json_dumps_params={"ensure_ascii": False})
