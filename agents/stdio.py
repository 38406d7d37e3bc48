"""MCP 的 stdio 传输：``mcp`` 包的低层 Server，工具与 HTTP 传输共用 :mod:`agents.tools`。"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from asgiref.sync import sync_to_async
from mcp.server import Server
from mcp.server.stdio import stdio_server

from agents.tools import INSTRUCTIONS, SERVER_NAME, call_tool, tool_definitions
from infra.principal import Principal


def build_server(principal: Principal) -> Server[Any]:
    """以 ``principal`` 的权限提供工具的 MCP Server。"""
    # ORM 是同步的：工具在 Django 的同步线程里执行（thread_sensitive，串行且复用同一个数据库连接）
    run_tool = sync_to_async(call_tool, thread_sensitive=True)

    async def on_list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_definitions())

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        result: types.CallToolResult = await run_tool(principal, params.name, params.arguments)
        return result

    return Server(SERVER_NAME, version="0.1.0", instructions=INSTRUCTIONS, on_list_tools=on_list_tools,
                  on_call_tool=on_call_tool)


def serve_stdio(principal: Principal) -> None:
    """在标准输入输出上服务，直到对端关闭。"""
    server = build_server(principal)

    async def main() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(main)
