"""http：远程 embedding 服务（OpenAI 风格 ``/v1/embeddings`` 或 Hugging Face TEI 风格 ``/embed``）。

错误分类（调用方据 ``EmbeddingError.transient`` 决定是否重试）：

- 连接失败、超时、5xx、408、429、响应格式不对 → ``transient=True``；
- 其他 4xx → ``transient=False``，消息里带服务端的错误说明，``status`` 为状态码。

维度在加载时发一条探测文本得到（``api="auto"`` 时顺便判断接口风格），之后每次响应都核对。

:func:`post_json`、:class:`ThreadLocalSessions`、:func:`request_timeout` 与 :func:`auth_headers` 是
通用的 JSON-over-HTTP 客户端部件，重排序的 http 提供方（:mod:`raglib.providers.rerank`）也用它们，
两边的超时、鉴权与错误分类因此一致。
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import requests

from raglib.providers.embedding_base import WARM_UP_TEXT, EmbeddingConfig, EmbeddingError
from raglib.providers.vectors import Vectors, l2_normalize

PROBE_TEXT = "ping"
# 连接阶段最多等这么久：服务不在时尽快失败，不必等满读超时
CONNECT_TIMEOUT = 5.0
TRANSIENT_STATUSES = frozenset({408, 429})
MAX_ERROR_CHARS = 500


class HttpEmbeddingProvider:
    """远程 embedding 服务的客户端；文本按 ``batch_size`` 分批、按输入顺序发送（服务端自己会排序合批）。"""

    provider = "http"

    def __init__(self, config: EmbeddingConfig) -> None:
        if not config.url:
            raise ValueError("the http embedding provider needs a url (RAG_EMBEDDING_URL)")
        self.model = config.model
        self._base = config.url.rstrip("/")
        self._api = config.api
        self._batch_size = config.batch_size
        self._timeout = request_timeout(config.timeout)
        self._query_instruction = config.query_instruction
        self._sessions = ThreadLocalSessions(auth_headers(config.api_key))
        self.dimension = 0
        self.dimension = self._probe()

    # ------------------------------------------------------------ 接口

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """文档向量。"""
        batch = list(texts)
        parts = [self._embed_batch(batch[i:i + self._batch_size]) for i in range(0, len(batch), self._batch_size)]
        if not parts:
            return np.empty((0, self.dimension), dtype=np.float32)
        return l2_normalize(np.concatenate(parts))

    def embed_query(self, text: str) -> Vectors:
        """查询向量；配置了 ``query_instruction`` 时加在查询前（如 e5 系列的 "query: "）。"""
        return l2_normalize(self._embed_batch([f"{self._query_instruction}{text}"]))[0]

    def warm_up(self, *, documents: bool) -> None:
        """模型在远程服务里，本进程没有可加载的东西：发一条查询，确认服务在、顺便建好本线程的连接。

        查询与文档走同一个接口，``documents`` 不改变做的事。
        """
        self.embed_query(WARM_UP_TEXT)

    @property
    def api(self) -> str:
        """实际使用的接口风格（``auto`` 在探测后确定）。"""
        return self._api

    # ------------------------------------------------------------ 请求

    def _probe(self) -> int:
        if self._api == "auto":
            try:
                self._api = "openai"
                return int(self._embed_batch([PROBE_TEXT]).shape[1])
            except EmbeddingError as exc:
                if exc.status not in (404, 405):
                    raise
                self._api = "tei"
        return int(self._embed_batch([PROBE_TEXT]).shape[1])

    def _endpoint(self) -> str:
        if self._api == "tei":
            return f"{self._base}/embed"
        # OpenAI 的 base_url 习惯写到 /v1 为止，两种写法都接受
        if self._base.endswith("/v1"):
            return f"{self._base}/embeddings"
        return f"{self._base}/v1/embeddings"

    def _embed_batch(self, texts: list[str]) -> np.ndarray[Any, Any]:
        if self._api == "tei":
            # truncate：超长输入由服务端截断，与本地模型的行为一致，而不是整批 413
            body = self._post({"inputs": texts, "truncate": True})
            rows = body
        else:
            body = self._post({"model": self.model, "input": texts, "encoding_format": "float"})
            rows = _openai_rows(body)
        try:
            matrix = np.asarray(rows, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise EmbeddingError(f"embedding server returned malformed vectors: {exc}", transient=True) from exc
        if matrix.ndim != 2 or matrix.shape[0] != len(texts) or matrix.shape[1] == 0:
            raise EmbeddingError(f"embedding server returned shape {matrix.shape} for {len(texts)} inputs",
                                 transient=True)
        if self.dimension and matrix.shape[1] != self.dimension:
            raise EmbeddingError(f"embedding server returned {matrix.shape[1]}-d vectors, expected "
                                 f"{self.dimension} (was the served model changed?)", transient=False)
        return matrix

    def _post(self, payload: dict[str, Any]) -> Any:
        return post_json(self._sessions.get(), self._endpoint(), payload, timeout=self._timeout,
                         service="embedding server", error=EmbeddingError)


def _openai_rows(body: Any) -> list[Any]:
    """OpenAI 响应的 ``data`` 按 ``index`` 排序后取向量（规范允许乱序返回）。"""
    try:
        data = body["data"]
        items = sorted(data, key=lambda item: int(item.get("index", 0)))
        return [item["embedding"] for item in items]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EmbeddingError("embedding server returned an unexpected OpenAI response", transient=True) from exc


def _server_message(response: requests.Response) -> str:
    """服务端的错误说明：OpenAI ``{"error": {"message"}}``、TEI ``{"error": "..."}``，否则正文开头。"""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:MAX_ERROR_CHARS]
        if isinstance(error, str) and error:
            return error[:MAX_ERROR_CHARS]
        if body.get("message"):
            return str(body["message"])[:MAX_ERROR_CHARS]
    return (response.text or response.reason or "").strip()[:MAX_ERROR_CHARS]


# ---------------------------------------------------------------- 通用部件（embedding 与 rerank 共用）


class HttpErrorFactory(Protocol):
    """构造提供方自己的异常类型，如 ``EmbeddingError(message, transient=..., status=...)``。"""

    def __call__(self, message: str, *, transient: bool, status: int | None = None) -> Exception: ...


def request_timeout(read_timeout: float) -> tuple[float, float]:
    """requests 的 ``(连接超时, 读超时)``：连接最多等 :data:`CONNECT_TIMEOUT`，服务不在时尽快失败。"""
    return (min(CONNECT_TIMEOUT, read_timeout), read_timeout)


def auth_headers(api_key: str) -> dict[str, str]:
    """JSON 请求的公共头；有 key 时带 ``Authorization: Bearer``。"""
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


class ThreadLocalSessions:
    """每个线程一个 ``requests.Session``（Session 不保证线程安全），各自复用连接。"""

    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = dict(headers)
        self._local = threading.local()

    def get(self) -> requests.Session:
        """当前线程的 Session（首次调用时创建）。"""
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers.update(self._headers)
            self._local.session = session
        return session


def post_json(session: requests.Session, url: str, payload: dict[str, Any], *, timeout: tuple[float, float],
              service: str, error: HttpErrorFactory) -> Any:
    """POST JSON 并返回解析后的响应体；失败时抛 ``error(...)``，分类见模块说明。

    ``service`` 是错误消息的主语（如 "embedding server"），``error`` 决定抛出的异常类型。
    """
    try:
        response = session.post(url, json=payload, timeout=timeout)
    except requests.Timeout as exc:
        raise error(f"{service} timed out: {url}", transient=True) from exc
    except requests.RequestException as exc:
        raise error(f"{service} unreachable: {url}: {exc}", transient=True) from exc
    status = response.status_code
    if status >= 400:
        message = _server_message(response)
        transient = status >= 500 or status in TRANSIENT_STATUSES
        raise error(f"{service} answered {status}: {message}", transient=transient, status=status)
    try:
        return response.json()
    except ValueError as exc:
        raise error(f"{service} returned invalid JSON ({status})", transient=True) from exc
