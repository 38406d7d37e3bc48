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

# 混合检索按本库模型排序（并用它给分）：目前关闭。伪查询是从原文抽句子去字，字面重合多，模型学得偏信全文一路；
# 在换了说法的真实问题上它比“各自证据 + 全局校准”的排序差（toyhom nDCG@10 0.266 对 0.329，squad hit@5 0.958 对 0.969，
# 见 docs/EVALUATION.md），而留出的伪查询自测看不出来。关闭时混合检索用全局校准的分数与排序，单路检索用本库模型的分数。
RANK_HYBRID_BY_MODEL = False
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
    if not (RANK_HYBRID_BY_MODEL and profile.rank_hybrid):
        # 混合检索不用模型（见 RANK_HYBRID_BY_MODEL；或自测里模型排序不如 RRF）：用全局校准的分数与排序
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
