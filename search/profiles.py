"""读取知识库的相关概率模型与分块的汉字写法（``search.models.RelevanceProfile``），按进程缓存。

检索的每个请求都要问一次“这个库有没有学好的模型”：缓存 30 秒，省掉这一次数据库往返；重新拟合后最多
30 秒生效（拟合本身是后台任务，不需要更快）。拟合与造题在 ``search.relevance``。
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

from cachetools import TTLCache

from raglib.relevance import MODE_FEATURES, RelevanceModel
from search.models import RelevanceProfile


@dataclass(frozen=True)
class _Profile:
    models: dict[str, RelevanceModel]
    script: str


_EMPTY = _Profile({}, "")
_cache: TTLCache[uuid.UUID, _Profile] = TTLCache(maxsize=4096, ttl=30)
_lock = threading.Lock()


def current(model: RelevanceModel) -> bool:
    """模型的特征是否就是当前代码为这种方式算的那些。"""
    return model.features == MODE_FEATURES.get(model.mode)


def _load(kb_id: uuid.UUID) -> _Profile:
    profile = RelevanceProfile.objects.filter(knowledge_base_id=kb_id).first()
    if profile is None:
        return _EMPTY
    # 特征与当前代码不一致的模型（升级前拟合的）不用：回到全局校准，等定时任务按新特征重新拟合
    models = {mode: model for mode, data in profile.mode_models.items()
              if current(model := RelevanceModel.from_dict(data))}
    if not profile.rank_hybrid:
        # 自测里模型排序不如 RRF：混合检索保持原来的做法（单路检索的排序就是该路的名次，模型只给分数）
        models.pop("hybrid", None)
    return _Profile(models, profile.script)


def _profile(kb_id: uuid.UUID) -> _Profile:
    with _lock:
        profile = _cache.get(kb_id)
    if profile is None:
        profile = _load(kb_id)
        with _lock:
            _cache[kb_id] = profile
    return profile


def relevance_model(kb_id: uuid.UUID, mode: str) -> RelevanceModel | None:
    """该知识库在该检索方式下学好的模型；没有拟合过（或混合检索没有采用）时为 None。"""
    return _profile(kb_id).models.get(mode)


def knowledge_base_script(kb_id: uuid.UUID) -> str:
    """该知识库分块的汉字写法（``hans`` / ``hant``；没有拟合过或汉字太少时为 ``""``）。"""
    return _profile(kb_id).script


def forget(kb_id: uuid.UUID) -> None:
    """拟合或删除模型之后调用：本进程立刻用新的（其他进程最多 30 秒后）。"""
    with _lock:
        _cache.pop(kb_id, None)
