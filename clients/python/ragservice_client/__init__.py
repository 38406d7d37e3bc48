"""ragservice 的 Python 客户端：检索、知识条目、文档上传与状态轮询、知识库管理。

只依赖 ``requests``，不导入 Django，可以单独安装（``pip install ./clients/python``）。

- 所有非 2xx 响应都抛 :class:`RagError` 的子类，带服务端的错误码、消息、请求 ID 与字段级 details；
- 503 / 429 与连接错误按指数退避重试（优先服从服务端的 ``Retry-After``），重试次数可配；
- 检索默认 5 秒超时（``search_timeout``），其余请求用 ``timeout``；
- 超时或断连之后的重试可能是第二次执行同一个写入（第一次其实已在服务端提交）：:meth:`RagClient.put_item`
  不照搬最后一次的答复，而是按条目的 ``created_at`` / ``updated_at`` 是否落在这次调用的时间窗里判断发生了什么。
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import requests

__all__ = [
    "AuthenticationError",
    "ConflictError",
    "ItemWrite",
    "KnowledgeHit",
    "NotFoundError",
    "PermissionDeniedError",
    "RagClient",
    "RagError",
    "RateLimitedError",
    "ServiceUnavailableError",
    "ValidationError",
]

# 服务端会在这些状态码上要求稍后再试；其余错误重试也不会成功
_RETRY_STATUSES = frozenset({429, 503})
_MAX_RETRY_AFTER = 60.0
# 客户端支持 Python 3.10，datetime.UTC 要 3.11 才有
_UTC = timezone.utc  # noqa: UP017


class RagError(Exception):
    """服务端返回的错误（统一错误格式）。"""

    def __init__(self, status: int, code: str, message: str, request_id: str | None = None,
                 details: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(f"{status} {code}: {message} (request_id={request_id})")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.details = list(details)


class ValidationError(RagError):
    """400：参数不合法；``details`` 指明字段。"""


class AuthenticationError(RagError):
    """401：缺少或无效的 API key。"""


class PermissionDeniedError(RagError):
    """403：key 无权访问该知识库、只读 key 写入，或知识库不可用。"""


class NotFoundError(RagError):
    """404：知识库、文档或条目不存在。"""


class ConflictError(RagError):
    """409/410：状态冲突（名称冲突、已删除、正在处理）。"""


class RateLimitedError(RagError):
    """429：请求过多（已按退避重试仍失败）。"""


class ServiceUnavailableError(RagError):
    """503：暂时不可用（embedding 熔断、未就绪）；已按退避重试仍失败。"""


_ERRORS: dict[int, type[RagError]] = {
    400: ValidationError, 401: AuthenticationError, 403: PermissionDeniedError, 404: NotFoundError,
    409: ConflictError, 410: ConflictError, 429: RateLimitedError, 503: ServiceUnavailableError,
}


@dataclass(frozen=True)
class KnowledgeHit:
    """``search_knowledge`` 的一条结果：有查询时是一个分块（带 score），没有查询时是一个条目（score 为 None）。"""

    text: str
    score: float | None
    external_id: str | None
    title: str
    domain: str
    category: str
    tags: list[str]
    document_id: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ItemWrite:
    """写入一个条目的结果：``result`` 为 created / updated / unchanged / queued。

    ``resent`` 为真表示请求发了不止一次（之前的尝试超时或断连，服务端可能已经执行了它）：这时 ``result``
    按条目的时间戳判断，而不是照搬最后一次的答复——第一次已经新建了条目时，重试会答 unchanged，这里仍是 created；
    ``chunks_embedded`` / ``chunks_reused`` 是最后一次答复的数（重试没有重算就是 0）。
    """

    result: str
    chunks_embedded: int
    chunks_reused: int
    item: dict[str, Any]
    resent: bool = False


@dataclass(frozen=True)
class _Exchange:
    """一次调用（含重试）最后得到的响应。"""

    response: requests.Response
    # 之前有一次尝试在传输层失败（超时、断连）：请求可能已经到了服务端并被执行
    resent: bool
    # 从第一次发出到收到最后的响应（秒，单调时钟）
    elapsed: float


class RagClient:
    """``RagClient("http://127.0.0.1:8000", "rag_xxx", knowledge_base_id=...)``。

    ``knowledge_base_id`` 是默认知识库，各方法也可逐次传入。
    """

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 30.0, search_timeout: float = 5.0,
                 knowledge_base_id: str | None = None, retries: int = 3, backoff: float = 0.5,
                 session: requests.Session | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.search_timeout = search_timeout
        self.knowledge_base_id = knowledge_base_id
        self.retries = retries
        self.backoff = backoff
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"Bearer {api_key}"

    # ------------------------------------------------------------ 检索

    def search(self, query: str, *, knowledge_base_id: str | None = None, top_k: int = 5, mode: str = "hybrid",
               rerank: bool | None = None, filters: Mapping[str, Any] | None = None,
               timeout: float | None = None) -> list[dict[str, Any]]:
        """``POST /search``：返回按 score 降序的分块（字段同 API 文档）。"""
        body: dict[str, Any] = {"query": query, "knowledge_base_id": self._kb(knowledge_base_id), "top_k": top_k,
                                "mode": mode, "filters": dict(filters or {})}
        if rerank is not None:
            body["rerank"] = rerank
        result: list[dict[str, Any]] = self._request("POST", "/search", json=body,
                                                     timeout=timeout or self.search_timeout)
        return result

    def search_knowledge(self, query: str | None = None, *, domain: str | None = None,
                         category: str | None = None, tags: Sequence[str] | None = None, top_k: int = 5,
                         knowledge_base_id: str | None = None) -> list[KnowledgeHit]:
        """有 ``query`` 时语义 + 全文检索（按 score 降序）；没有时按元数据过滤列出条目。

        过滤之间是“且”；``tags`` 匹配含其中任一标签的条目。
        """
        filters: dict[str, Any] = {}
        if domain:
            filters["domain"] = domain
        if category:
            filters["category"] = category
        if tags:
            filters["tags_any"] = list(tags)
        if query:
            return [_hit_from_chunk(hit) for hit in self.search(
                query, knowledge_base_id=knowledge_base_id, top_k=top_k, filters=filters)]
        page = self.list_items(knowledge_base_id=knowledge_base_id, page_size=top_k, domain=domain,
                               category=category, tags_any=list(tags or ()))
        return [_hit_from_item(item) for item in page["items"]]

    # ------------------------------------------------------------ 知识条目

    def put_item(self, external_id: str, content: str, *, title: str = "", domain: str = "", category: str = "",
                 tags: Sequence[str] = (), metadata: Mapping[str, Any] | None = None,
                 knowledge_base_id: str | None = None) -> ItemWrite:
        """按外部 id 写入条目（幂等：内容没变时 result=unchanged，不做任何工作）。"""
        body = {"content": content, "title": title, "domain": domain, "category": category, "tags": list(tags),
                "metadata": dict(metadata or {})}
        exchange = self._exchange("PUT", self._item_path(knowledge_base_id, external_id), json=body)
        data = _parsed(exchange.response)
        result = data["result"]
        if exchange.resent:
            result = _resent_result(result, data["item"], since=_call_started(exchange))
        return ItemWrite(result=result, chunks_embedded=data["chunks_embedded"], chunks_reused=data["chunks_reused"],
                         item=data["item"], resent=exchange.resent)

    def bulk_upsert(self, items: Iterable[Mapping[str, Any]], *,
                    knowledge_base_id: str | None = None) -> list[dict[str, Any]]:
        """批量写入（每项含 external_id 与 PUT 的字段），返回逐条结果。

        请求超时后重试过时（每条结果的 ``resent`` 为真），答 unchanged 的条目按它的时间戳改判为 created / updated，
        规则同 :class:`ItemWrite`。"""
        exchange = self._exchange("POST", f"/knowledge_bases/{self._kb(knowledge_base_id)}/items/bulk",
                                  json={"items": [dict(item) for item in items]})
        results: list[dict[str, Any]] = _parsed(exchange.response)["results"]
        if not exchange.resent:
            return [{**row, "resent": False} for row in results]
        since = _call_started(exchange)
        return [{**row, "result": _resent_result(row["result"], row, since=since), "resent": True} for row in results]

    def get_item(self, external_id: str, *, knowledge_base_id: str | None = None) -> dict[str, Any]:
        item: dict[str, Any] = self._request("GET", self._item_path(knowledge_base_id, external_id))
        return item

    def delete_item(self, external_id: str, *, knowledge_base_id: str | None = None) -> None:
        self._request("DELETE", self._item_path(knowledge_base_id, external_id))

    def list_items(self, *, knowledge_base_id: str | None = None, page: int = 1, page_size: int = 20,
                   domain: str | None = None, category: str | None = None, tags_any: Sequence[str] = (),
                   tags_all: Sequence[str] = ()) -> dict[str, Any]:
        """条目分页列表，按元数据过滤（字段之间“且”；tags_any 任一、tags_all 全部）。"""
        params: dict[str, Any] = {"page": page, "page_size": page_size, "domain": domain, "category": category,
                                  "tags_any": ",".join(tags_any) or None, "tags_all": ",".join(tags_all) or None}
        page_data: dict[str, Any] = self._request(
            "GET", f"/knowledge_bases/{self._kb(knowledge_base_id)}/items",
            params={key: value for key, value in params.items() if value is not None})
        return page_data

    def sync_domain(self, domain: str, version: str, items: Iterable[Mapping[str, Any]], *, dry_run: bool = False,
                    knowledge_base_id: str | None = None) -> dict[str, Any]:
        """整体同步一个 domain（版本与内容未变则跳过，文件里没有的旧条目会被删除）。

        请求超时后重试过时（``resent`` 为真），重试本身只会答“跳过”：服务端当前版本的写入时间落在这次调用里，说明
        是之前超时的那次写的，返回那次同步的统计（``skipped`` 为假），而不是“什么都没做”。"""
        exchange = self._exchange(
            "POST", f"/knowledge_bases/{self._kb(knowledge_base_id)}/domains/{domain}/sync",
            json={"version": version, "items": [dict(item) for item in items], "dry_run": dry_run})
        stats: dict[str, Any] = _parsed(exchange.response)
        synced = _timestamp(stats.get("synced_at"))
        if (exchange.resent and stats.get("skipped") and stats.get("last_applied")
                and synced is not None and synced >= _call_started(exchange)):
            stats = {**stats["last_applied"], "synced_at": stats["synced_at"], "last_applied": None}
        return {**stats, "resent": exchange.resent}

    # ------------------------------------------------------------ 文档

    def upload_document(self, path: str | Path, *, metadata: Mapping[str, Any] | None = None,
                        chunking: Mapping[str, Any] | None = None,
                        knowledge_base_id: str | None = None) -> dict[str, Any]:
        """上传文档（202），返回 document_id 与 status；用 :meth:`wait_for_document` 等待摄取完成。"""
        path = Path(path)
        form: dict[str, str] = {}
        if metadata:
            form["metadata"] = json.dumps(dict(metadata), ensure_ascii=False)
        if chunking:
            form["chunking"] = json.dumps(dict(chunking))
        with path.open("rb") as handle:
            accepted: dict[str, Any] = self._request(
                "POST", f"/knowledge_bases/{self._kb(knowledge_base_id)}/documents", data=form,
                files={"file": (path.name, handle)})
        return accepted

    def get_document(self, document_id: str) -> dict[str, Any]:
        document: dict[str, Any] = self._request("GET", f"/documents/{document_id}")
        return document

    def wait_for_document(self, document_id: str, *, timeout: float = 300.0, interval: float = 1.0) -> dict[str, Any]:
        """轮询直到文档不再 processing（且没有排队的重新索引），返回最终详情；超时抛 TimeoutError。"""
        deadline = time.monotonic() + timeout
        while True:
            document = self.get_document(document_id)
            if document["status"] != "processing" and document.get("reindex_status") not in ("queued", "running"):
                return document
            if time.monotonic() > deadline:
                raise TimeoutError(f"document {document_id} still {document['status']} after {timeout} s")
            time.sleep(interval)

    def delete_document(self, document_id: str) -> None:
        self._request("DELETE", f"/documents/{document_id}")

    # ------------------------------------------------------------ 知识库

    def create_knowledge_base(self, name: str, *, description: str = "", **options: Any) -> dict[str, Any]:
        """创建知识库；``options`` 可含 embedding / chunking / item_chunking。"""
        kb: dict[str, Any] = self._request("POST", "/knowledge_bases",
                                           json={"name": name, "description": description, **options})
        return kb

    def list_knowledge_bases(self, *, page: int = 1, page_size: int = 20,
                             name_contains: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"page": page, "page_size": page_size}
        if name_contains:
            params["name_contains"] = name_contains
        page_data: dict[str, Any] = self._request("GET", "/knowledge_bases", params=params)
        return page_data

    def get_knowledge_base(self, knowledge_base_id: str | None = None) -> dict[str, Any]:
        kb: dict[str, Any] = self._request("GET", f"/knowledge_bases/{self._kb(knowledge_base_id)}")
        return kb

    def update_knowledge_base(self, knowledge_base_id: str, **changes: Any) -> dict[str, Any]:
        kb: dict[str, Any] = self._request("PATCH", f"/knowledge_bases/{knowledge_base_id}", json=changes)
        return kb

    def delete_knowledge_base(self, knowledge_base_id: str) -> dict[str, Any]:
        """删除知识库（202），返回 cleanup_task_id。"""
        accepted: dict[str, Any] = self._request("DELETE", f"/knowledge_bases/{knowledge_base_id}")
        return accepted

    # ------------------------------------------------------------ 传输

    def _kb(self, knowledge_base_id: str | None) -> str:
        kb = knowledge_base_id or self.knowledge_base_id
        if not kb:
            raise ValueError("knowledge_base_id is required (pass it or set RagClient(knowledge_base_id=...))")
        return kb

    def _item_path(self, knowledge_base_id: str | None, external_id: str) -> str:
        return f"/knowledge_bases/{self._kb(knowledge_base_id)}/items/{requests.utils.quote(external_id, safe='')}"

    def _request(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> Any:
        """发请求并解析响应；重试见 :meth:`_exchange`，最终失败抛对应的 :class:`RagError` 子类。"""
        return _parsed(self._exchange(method, path, timeout=timeout, **kwargs).response)

    def _exchange(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> _Exchange:
        """发请求；503/429 与连接错误、超时按退避重试，返回最后的响应（可能是错误响应）。"""
        attempt = 0
        resent = False
        started = time.monotonic()
        while True:
            files = kwargs.get("files")
            if files and attempt:
                for _, handle in files.values():
                    handle.seek(0)
            try:
                response = self.session.request(method, self.base_url + path, timeout=timeout or self.timeout,
                                                **kwargs)
            except (requests.ConnectionError, requests.Timeout):
                if attempt >= self.retries:
                    raise
                # 连接在请求发出之后才断、或读超时：服务端可能已经执行了这次请求
                resent = True
                time.sleep(self.backoff * 2**attempt)
                attempt += 1
                continue
            if response.status_code in _RETRY_STATUSES and attempt < self.retries:
                time.sleep(_retry_delay(response, self.backoff * 2**attempt))
                attempt += 1
                continue
            return _Exchange(response, resent, time.monotonic() - started)


def _parsed(response: requests.Response) -> Any:
    """非 2xx 抛对应的 :class:`RagError` 子类；204 或空响应体为 None，否则是解析后的 JSON。"""
    if response.status_code >= 400:
        raise _error(response)
    if response.status_code == 204 or not response.content:
        return None
    return response.json()


def _call_started(exchange: _Exchange) -> datetime:
    """这次调用开始的时刻，按服务端的时钟：最后一次响应的 ``Date`` 减去调用的总耗时。

    用服务端的时钟才能与条目的 ``created_at`` 比较（客户端与服务端的时钟可能差得很远）。``Date`` 只精确到秒且是
    截断的，算出的时刻因此只会偏早，不会把这次调用里的提交漏掉。没有 ``Date`` 时退回本机时钟。
    """
    try:
        server_now = parsedate_to_datetime(exchange.response.headers["Date"])
    except (KeyError, TypeError, ValueError):
        server_now = datetime.now(_UTC)
    if server_now.tzinfo is None:
        server_now = server_now.replace(tzinfo=_UTC)
    return server_now - timedelta(seconds=exchange.elapsed)


def _timestamp(value: Any) -> datetime | None:
    """API 里的 ISO 8601 时间（``Z`` 或带偏移）；Python 3.10 的 fromisoformat 不认 ``Z``。"""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=_UTC)


def _resent_result(result: str, item: Mapping[str, Any], *, since: datetime) -> str:
    """请求发了不止一次时，这次调用实际做了什么。

    只有 unchanged 需要重新判断：最后一次答 unchanged，可能是因为之前超时的那一次已经写进去了。条目在这次调用的
    时间窗里被创建 → created；创建得更早、但在窗里被更新过 → updated；否则确实没有变化。
    created / updated / queued 是最后一次自己做的事，照旧。
    """
    if result != "unchanged":
        return result
    created, updated = _timestamp(item.get("created_at")), _timestamp(item.get("updated_at"))
    if created is not None and created >= since:
        return "created"
    if updated is not None and updated >= since:
        return "updated"
    return result


def _retry_delay(response: requests.Response, default: float) -> float:
    try:
        return min(float(response.headers["Retry-After"]), _MAX_RETRY_AFTER)
    except (KeyError, ValueError):
        return default


def _error(response: requests.Response) -> RagError:
    try:
        body = response.json()["error"]
        code, message, request_id, details = body["code"], body["message"], body.get("request_id"), body["details"]
    except (ValueError, KeyError, TypeError):
        code, message, request_id, details = "HTTP_ERROR", response.text[:500], None, []
    request_id = request_id or response.headers.get("X-Request-ID")
    return _ERRORS.get(response.status_code, RagError)(response.status_code, code, message, request_id, details)


def _hit_from_chunk(hit: Mapping[str, Any]) -> KnowledgeHit:
    metadata = dict(hit.get("metadata") or {})
    return KnowledgeHit(
        text=hit["chunk_text"], score=hit["score"], external_id=metadata.get("external_id"),
        title=metadata.get("title", ""), domain=metadata.get("domain", ""), category=metadata.get("category", ""),
        tags=list(metadata.get("tags") or []), document_id=hit["document_id"], metadata=metadata,
    )


def _hit_from_item(item: Mapping[str, Any]) -> KnowledgeHit:
    return KnowledgeHit(
        text=item["content"], score=None, external_id=item["external_id"], title=item["title"],
        domain=item["domain"], category=item["category"], tags=list(item["tags"]),
        document_id=str(item["document_id"]), metadata=dict(item["metadata"]),
    )
