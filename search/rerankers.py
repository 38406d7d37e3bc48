"""把 RAG_RERANK_* 设置翻译成配置好的重排序入口（进程内缓存、断路器与结果缓存由 providers 负责）。"""

from __future__ import annotations

from django.conf import settings

from raglib.providers.rerank import GuardedReranker, RerankConfig, get_reranker


def rerank_config() -> RerankConfig | None:
    """当前设置对应的配置；``RAG_RERANK_PROVIDER=none`` 时为 None（不重排）。"""
    if settings.RERANK_PROVIDER == "none":
        return None
    return RerankConfig(
        provider=settings.RERANK_PROVIDER,
        model=settings.RERANK_MODEL,
        url=settings.RERANK_URL,
        api=settings.RERANK_API,
        api_key=settings.RERANK_API_KEY,
        device=settings.RERANK_DEVICE,
        batch_size=settings.RERANK_BATCH_SIZE,
        max_length=settings.RERANK_MAX_LENGTH,
        timeout=settings.RERANK_TIMEOUT,
        retries=settings.RERANK_RETRIES,
        failure_threshold=settings.RERANK_BREAKER_FAILURES,
        reset_timeout=settings.RERANK_BREAKER_RESET_SECONDS,
        cache_size=settings.RERANK_CACHE_SIZE,
        cache_ttl=settings.RERANK_CACHE_TTL,
    )


def configured_reranker() -> GuardedReranker | None:
    """配置的重排序入口；很便宜（模型在第一次重排序时才加载），每次检索调用即可。"""
    config = rerank_config()
    return None if config is None else get_reranker(config)
