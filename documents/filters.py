"""按元数据过滤分块：``POST /search`` 与条目列表（``GET .../items``）共用同一段 SQL。

分块的 ``metadata`` 复制了所属文档的 title/domain/category/tags 与文件名，所以过滤直接作用在分块上。
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SearchFilters:
    """元数据过滤：同一字段内多个值是“任一”，不同字段之间是“且”。"""

    domains: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    tags_any: tuple[str, ...] = ()
    tags_all: tuple[str, ...] = ()
    document_ids: tuple[uuid.UUID, ...] = ()
    filenames: tuple[str, ...] = ()

    def sql(self) -> tuple[str, list[Any]]:
        """追加到 WHERE 的条件（以 AND 开头）与参数；分块元数据里复制了文档元数据与文件名。"""
        clauses: list[str] = []
        params: list[Any] = []
        for key, values in (("domain", self.domains), ("category", self.categories), ("filename", self.filenames)):
            if values:
                clauses.append(f"c.metadata->>'{key}' = ANY(%s)")
                params.append(list(values))
        if self.tags_any:
            # tags 可能是字符串数组，也可能是单个字符串；jsonb ?| 对两者都成立
            clauses.append("c.metadata->'tags' ?| %s")
            params.append(list(self.tags_any))
        if self.tags_all:
            clauses.append("c.metadata->'tags' ?& %s")
            params.append(list(self.tags_all))
        if self.document_ids:
            clauses.append("c.document_id = ANY(%s)")
            params.append(list(self.document_ids))
        return "".join(f" AND {clause}" for clause in clauses), params
