"""分块参数的合并与校验：全局默认（RAG_CHUNK_*）← 知识库默认 ← 单次上传覆盖。"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from django.conf import settings

from infra.errors import ApplicationError, ErrorCode, ErrorDetail
from raglib.chunking import ChunkingOptions

_FIELDS = {f.name for f in fields(ChunkingOptions)}
# 知识条目的默认分块：按段落，块不跨段落（过长的段在段内按字符递归切 1000/200）——Agent 按段落改条目，
# 改一段只重算那一段的块（见 raglib.chunking.paragraphs 与 docs/INVARIANTS.md 的 ITEM-PARAGRAPH-EDIT）
ITEM_CHUNKING_DEFAULTS: dict[str, Any] = {"strategy": "paragraph"}


def chunking_options(*layers: dict[str, Any], field_name: str = "chunking") -> ChunkingOptions:
    """按层合并后校验；非法取值抛 400 VALIDATION_ERROR（字段级 details）。

    每层可以只给部分键；换了 strategy 的层会先取该策略的默认值（如 recursive 的 1000/200 字符）。
    """
    merged: dict[str, Any] = {"strategy": settings.CHUNK_STRATEGY}
    if settings.CHUNK_STRATEGY == "token":
        merged |= {"chunk_size": settings.CHUNK_SIZE, "overlap": settings.CHUNK_OVERLAP}
    for layer in layers:
        unknown = sorted(set(layer) - _FIELDS)
        if unknown:
            raise _invalid(field_name, unknown[0], "Unknown chunking option")
        if "strategy" in layer and layer["strategy"] != merged["strategy"]:
            merged = {"strategy": layer["strategy"]}
        merged |= layer
    strategy = merged.pop("strategy")
    try:
        options = ChunkingOptions.for_strategy(strategy, **merged)
        options.validate()
    except (ValueError, TypeError) as exc:
        raise _invalid(field_name, None, str(exc)) from exc
    return options


def options_dict(options: ChunkingOptions) -> dict[str, Any]:
    """存进 JSON 字段的形式。"""
    return asdict(options)


def _invalid(field_name: str, key: str | None, message: str) -> ApplicationError:
    name = f"{field_name}.{key}" if key else field_name
    return ApplicationError(ErrorCode.VALIDATION_ERROR, "Invalid chunking options", 400,
                            [ErrorDetail(name, "INVALID", message)])
