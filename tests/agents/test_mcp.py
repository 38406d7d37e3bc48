"""MCP：用 ``mcp`` 包的客户端分别经 stdio（``manage.py mcp`` 子进程）与 streamable HTTP（web 进程的 /mcp）
列出工具、检索、写入与删除条目；作用域是别的知识库的 key 得到错误而不是数据。
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from django.conf import settings
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from documents import items
from knowledge.models import KnowledgeBase
from tests import workers
from tests.conftest import FakeEmbedder, assert_error

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

TOOL_NAMES = {"search_knowledge", "list_knowledge_bases", "upsert_knowledge_item", "delete_knowledge_item",
              "get_document_status"}


@pytest.fixture
def garden(kb_factory: Any, fake_embedder: FakeEmbedder) -> KnowledgeBase:
    kb = kb_factory(name="花园")
    items.item_bulk_upsert(kb=kb, items=[
        items.ItemInput(external_id="rose", content="月季喜欢阳光充足、排水良好的土壤。", title="月季", domain="garden",
                        tags=("花",)),
        items.ItemInput(external_id="gil", content="CPython 的全局解释器锁限制线程并行。", title="GIL",
                        domain="python"),
    ])
    return kb


async def exercise(session: ClientSession, kb: KnowledgeBase, other: KnowledgeBase) -> dict[str, Any]:
    """两种传输跑同一套交互，返回各步结果供断言。"""
    await session.initialize()
    tools = await session.list_tools()
    search = await session.call_tool("search_knowledge", {"knowledge_base_id": str(kb.id), "query": "月季 土壤",
                                                          "top_k": 3})
    listing = await session.call_tool("search_knowledge", {"knowledge_base_id": str(kb.id), "domain": "python"})
    kbs = await session.call_tool("list_knowledge_bases", {})
    denied = await session.call_tool("search_knowledge", {"knowledge_base_id": str(other.id), "query": "月季"})
    return {"tools": tools.tools, "search": search, "listing": listing, "kbs": kbs, "denied": denied}


def check(outcome: dict[str, Any], kb: KnowledgeBase) -> None:
    tools = {tool.name: tool for tool in outcome["tools"]}
    assert set(tools) == TOOL_NAMES
    assert tools["search_knowledge"].input_schema["required"] == ["knowledge_base_id"]
    assert "检索" in (tools["search_knowledge"].description or "")
    search = outcome["search"]
    assert not search.is_error
    results = search.structured_content["results"]
    assert results and results[0]["metadata"]["external_id"] == "rose"
    assert json.loads(search.content[0].text)["results"][0]["chunk_text"].startswith("月季")
    assert [i["external_id"] for i in outcome["listing"].structured_content["items"]] == ["gil"]
    assert [k["id"] for k in outcome["kbs"].structured_content["knowledge_bases"]] == [str(kb.id)]
    denied = outcome["denied"]
    assert denied.is_error and denied.structured_content["error"]["code"] == "PERMISSION_DENIED"
    assert "results" not in denied.structured_content


def test_streamable_http(live_server: Any, make_client: Any, garden: KnowledgeBase, kb_factory: Any) -> None:
    other = kb_factory(name="别的库")
    key = make_client(kbs=[garden]).raw_key

    async def run() -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
                streamable_http_client(f"{live_server.url}/mcp", http_client=http) as (read, write), \
                ClientSession(read, write) as session:
            outcome = await exercise(session, garden, other)
            written = await session.call_tool("upsert_knowledge_item", {
                "knowledge_base_id": str(garden.id), "external_id": "orchid", "content": "兰花需要散射光。",
                "domain": "garden", "tags": ["花"]})
            outcome["written"] = written
            outcome["again"] = await session.call_tool("upsert_knowledge_item", {
                "knowledge_base_id": str(garden.id), "external_id": "orchid", "content": "兰花需要散射光。",
                "domain": "garden", "tags": ["花"]})
            outcome["deleted"] = await session.call_tool("delete_knowledge_item", {
                "knowledge_base_id": str(garden.id), "external_id": "orchid"})
            outcome["missing"] = await session.call_tool("get_document_status", {"document_id": "nope"})
            return outcome

    outcome = anyio.run(run)
    check(outcome, garden)
    assert outcome["written"].structured_content["result"] == "created"
    assert outcome["again"].structured_content["result"] == "unchanged"
    assert outcome["deleted"].structured_content == {"deleted": True}
    assert outcome["missing"].structured_content["error"]["code"] == "DOCUMENT_NOT_FOUND"


def test_http_requires_api_key(client: Any, make_client: Any) -> None:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    assert_error(client.post("/mcp", message, content_type="application/json"), 401, "UNAUTHORIZED")
    reader = make_client(access="read")
    response = reader.post("/mcp", [message, {"jsonrpc": "2.0", "method": "notifications/initialized"},
                                    {"jsonrpc": "2.0", "id": 2, "method": "nope"}], format="json")
    replies = response.json()
    assert [r["id"] for r in replies] == [1, 2] and replies[1]["error"]["code"] == -32601
    assert reader.post("/mcp", {"jsonrpc": "2.0", "method": "notifications/initialized"},
                       format="json").status_code == 202
    assert_error(reader.get("/mcp"), 405, "METHOD_NOT_ALLOWED")
    written = reader.post("/mcp", {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "upsert_knowledge_item", "arguments": {"knowledge_base_id": "x", "external_id": "a",
                                                       "content": "c"}}}, format="json").json()
    assert written["result"]["isError"] is True


def test_stdio(tmp_path: Path, make_client: Any, garden: KnowledgeBase, kb_factory: Any) -> None:
    other = kb_factory(name="别的库")
    key = make_client(kbs=[garden]).raw_key
    env = {**os.environ, "RAG_DATABASE_URL": workers.test_database_url(), "RAG_DATA_DIR": str(settings.DATA_DIR),
           "RAG_RERANK_PROVIDER": "none"}
    params = StdioServerParameters(command=sys.executable,
                                   args=[str(workers.ROOT / "manage.py"), "mcp", "--api-key", key],
                                   env=env, cwd=str(workers.ROOT))
    errlog = (tmp_path / "mcp-stderr.log").open("w")

    async def run() -> dict[str, Any]:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            return await exercise(session, garden, other)

    try:
        outcome = anyio.run(run)
    finally:
        errlog.close()
    check(outcome, garden)


def test_in_process_server_and_command_key_check(make_client: Any, garden: KnowledgeBase) -> None:
    """stdio 用的 Server 对象在进程内（mcp 的内存传输）同样可用；无效 key 让命令直接失败。"""
    from asgiref.sync import sync_to_async
    from django.core.management import CommandError, call_command
    from django.db import connections
    from mcp.client import Client

    from agents.stdio import build_server
    from ops.auth import principal_for_key

    principal = principal_for_key(make_client(access="read", kbs=[garden]).raw_key)
    assert principal is not None

    async def run() -> Any:
        async with Client(build_server(principal), mode="legacy") as client:
            tools = await client.list_tools()
            written = await client.call_tool("upsert_knowledge_item", {
                "knowledge_base_id": str(garden.id), "external_id": "x", "content": "只读 key 不能写"})
            # 工具在 asgiref 的同步线程里执行：关掉那个线程的数据库连接，测试库才能在会话结束时删除
            await sync_to_async(connections.close_all, thread_sensitive=True)()
            return tools, written

    tools, written = anyio.run(run)
    assert {tool.name for tool in tools.tools} == TOOL_NAMES
    assert written.is_error and written.structured_content["error"]["code"] == "PERMISSION_DENIED"
    with pytest.raises(CommandError, match="invalid or revoked API key"):
        call_command("mcp", "--api-key", "rag_not_a_key")
