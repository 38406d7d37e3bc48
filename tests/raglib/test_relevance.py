"""raglib.relevance 的纯函数：伪查询、特征、逻辑回归模型。"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raglib.relevance import (
    FEATURE_SIGNS,
    MODE_FEATURES,
    MODEL_REVISION,
    MONOTONE_CHUNKS,
    SMALL_CHUNKS,
    SMALL_MODE_FEATURES,
    DropShare,
    Evidence,
    RelevanceModel,
    ambiguous,
    candidate_features,
    fit_logistic,
    fit_model,
    mode_features,
    pseudo_queries,
    reciprocal_rank,
    without,
)
from raglib.scoring import Calibration

CHUNKS = [
    (1, "月季喜欢阳光充足、排水良好的土壤，春季修剪可以促进开花。兰花需要散射光和较高的空气湿度。"),
    (2, "投标人须具备信息系统集成资质，服务期三年，预算人民币五百万元。评标采用综合评分法。"),
    (3, "The interpreter runs bytecode produced by the compiler. Running tests with pytest is simple and fast."),
    (4, "短"),
]


def test_pseudo_queries_are_deterministic_and_drop_part_of_a_sentence() -> None:
    first = pseudo_queries(CHUNKS, 10, seed=7)
    assert first == pseudo_queries(CHUNKS, 10, seed=7)
    assert first != pseudo_queries(CHUNKS, 10, seed=8)
    assert {q.source for q in first} == {1, 2, 3}  # 太短的分块没有可用的句子
    for query in first:
        source = dict(CHUNKS)[query.source]
        assert query.sentence in source and query.text != query.sentence
        if query.source == 3:  # 拉丁文字去词，保持次序
            words = query.sentence.split()
            kept = query.text.split()
            assert kept and all(word in words for word in kept)
        else:  # 中文去字：剩下的字是原句的子序列，去掉了约三分之一
            iterator = iter(query.sentence)
            assert all(char in iterator for char in query.text)
            assert 0.2 <= 1 - len(query.text) / len(query.sentence) <= 0.6


def test_pseudo_queries_drop_by_the_script_of_each_sentence() -> None:
    """汉字句按 ``han`` 去字，其他文字的句子按 ``other`` 去词：同一批分块里两种比例互不影响。"""
    made = pseudo_queries(CHUNKS, 10, seed=7, share=DropShare(han=0.6, other=0.0))
    english = [q for q in made if q.source == 3]
    chinese = [q for q in made if q.source != 3]
    assert english and chinese
    assert all(q.text == q.sentence for q in english)  # 不去词
    assert all(1 - len(q.text) / len(q.sentence) >= 0.55 for q in chinese)
    # 反过来：汉字句不去字，英文句去掉大半的词
    reverse = pseudo_queries(CHUNKS, 10, seed=7, share=DropShare(han=0.0, other=0.9))
    assert all(q.text == q.sentence for q in reverse if q.source != 3)
    assert all(len(q.text.split()) < len(q.sentence.split()) / 2 for q in reverse if q.source == 3)


def test_pseudo_queries_skip_sentences_the_drop_leaves_unrecognisable() -> None:
    """去字（词）后剩下的太少（“1枚；”）的句子不出题：库里许多分块同样匹配它，标签却只认出题的那一块。
    被跳过的句子不让后面的轮次提前结束：同一分块里还有可用的句子，照样出题。"""
    chunks = [(0, "臀鳍鳍条119至156枚；背鳍硬棘8枚，软条9枚。Dorsal 8 9 10 11 rays. "
                  "本鱼分布于西北太平洋，包括日本及台湾水域，栖息在水深零至两公尺的沿岸浅海。"),
              (1, "背鳍硬棘3枚，软条10枚；臀鳍硬棘3枚、软条10枚。")]
    made = pseudo_queries(chunks, 10, seed=0, share=DropShare(han=0.55, other=0.35))
    assert [q.sentence for q in made] == ["本鱼分布于西北太平洋，包括日本及台湾水域，栖息在水深零至两公尺的沿岸浅海。"]
    assert len(re.findall(r"[\u3400-\u9fff]", made[0].text)) >= 6
    # 不去字时短句照样出题：门槛看的是去完剩下的，不是句子本身
    assert len(pseudo_queries(chunks, 10, seed=0, share=DropShare(han=0.0, other=0.0))) == 5


def test_pseudo_queries_are_whole_sentences_across_hard_line_breaks() -> None:
    """PDF 转出的正文每行硬换行：伪查询的“一句”与分块器同一个定义，不是一行的片段；空行与标题照样断句。"""
    chunk = ("# Methods\nWe train the retrieval model on one million question and\n"
             "passage pairs drawn from the web, e.g. forums and encyclopedias.\n\n"
             "The evaluation uses three held out sets of long scientific papers.")
    made = pseudo_queries([(0, chunk)], 10, seed=0, share=DropShare.both(0.0))
    assert sorted(q.sentence for q in made) == [
        "The evaluation uses three held out sets of long scientific papers.",
        "We train the retrieval model on one million question and\n"
        "passage pairs drawn from the web, e.g. forums and encyclopedias.",
    ]


def test_a_sentence_with_near_copies_in_other_articles_is_ambiguous() -> None:
    """别的文章里有几乎同一句（只差数字的鱼类条目、改了几个词的英文句）又不是原样：这条伪查询没有确定的答案。
    原样出现（转载的同一篇）与话题相近的句子都不算。"""
    fish = "背鳍硬棘9枚、背其软条11至13枚、臀鳍硬棘3枚、臀鳍软条11至13枚。"
    assert ambiguous(fish, ["本鱼体延长。背鳍硬棘9枚、背鳍软条12枚、臀鳍硬棘3枚、臀鳍软条10枚。尾鳍叉形。"])
    assert not ambiguous(fish, [f"本鱼体延长。{fish}尾鳍叉形。", "本鱼分布于西北太平洋。背鳍与臀鳍都很小。"])
    english = "The interpreter runs bytecode produced by the compiler."
    assert ambiguous(english, ["Intro. The interpreter executes bytecode produced by a compiler. More."])
    assert not ambiguous(english, ["The university was founded by the order in the nineteenth century."])
    assert not ambiguous(english, [])


def test_small_knowledge_bases_get_more_than_one_pseudo_query_per_chunk() -> None:
    """分块比要造的题少时一轮轮地从各分块里取还没出过题的句子，不重复、用完为止；分块够多时每块一句（与以前相同）。"""
    chunks = [(i, "。".join(f"第{i}号分块的第{j}句话讲的是一件相当具体的事情" for j in range(4)) + "。")
              for i in range(3)]
    made = pseudo_queries(chunks, 10, seed=0)
    assert len(made) == 10 and len({q.sentence for q in made}) == 10
    assert all(q.sentence in dict(chunks)[q.source] for q in made)
    assert len(pseudo_queries(chunks, 50, seed=0)) == 12  # 3 块各 4 句，用完为止
    assert sorted(q.source for q in pseudo_queries(chunks, 3, seed=0)) == [0, 1, 2]
    # variants：每句最多出这么多条，每条去掉的字不同（很小的库只有几句话）
    repeated = pseudo_queries(chunks, 50, seed=0, variants=3)
    assert len(repeated) == 36 and max(Counter(q.sentence for q in repeated).values()) == 3
    assert len({q.text for q in repeated}) > 24


def test_a_sample_weight_counts_a_row_as_that_many_rows() -> None:
    """拿掉答案的变体在拟合里算几条（search.relevance.ABSENT）：权重 3 与把那些行重复三遍拟合出同一个模型。"""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 2))
    y = (x[:, 0] + rng.normal(size=60) > 0).astype(float)
    negatives = x[y == 0]
    weighted = fit_logistic(x, y, weights=np.where(y == 0, 3.0, 1.0), l2=1.0)
    repeated = fit_logistic(np.vstack([x, negatives, negatives]), np.concatenate([y, np.zeros(2 * len(negatives))]),
                            l2=1.0)
    assert np.allclose(weighted[0], repeated[0]) and weighted[1] == pytest.approx(repeated[1])


def test_candidate_features_are_relative_to_the_best_candidate() -> None:
    calibration = Calibration(0.8, 0.05, 0.5, 0.1, 10.0, 4.0, -9.0)
    rows = candidate_features([Evidence(0.9, 0.5, 1, 3, 1), Evidence(0.8, None, 2, None, 2)], coverage=0.7, depth=50,
                              calibration=calibration)
    near = candidate_features([Evidence(0.9, 0.5, 1, 3, 1, proximity=0.5)], coverage=0.7, depth=50, gate=0.5,
                              calibration=replace(calibration, hybrid_proximity=2.0))
    assert rows[0]["similarity_gap"] == 0.0 and rows[1]["similarity_gap"] == pytest.approx(-0.1)
    assert rows[1]["match"] == 0.0 and rows[1]["match_share"] == 0.0 and rows[0]["match_share"] == 1.0
    assert rows[1]["fulltext_rank"] == pytest.approx(math.log1p(51))  # 没进全文名单：按名单之后一名计
    assert (rows[0]["both"], rows[1]["both"]) == (1.0, 0.0) and rows[0]["coverage"] == 0.7
    assert set(rows[0]) >= set(MODE_FEATURES["hybrid"]) | set(MODE_FEATURES["vector"]) | set(MODE_FEATURES["fulltext"])
    # 混合方式的特征是全局校准的对数几率（与 raglib.scoring.hybrid_score 同一个式子）
    assert rows[0]["calibrated"] == pytest.approx(10.0 * 0.9 + 4.0 * 0.5 - 9.0)
    assert rows[1]["calibrated"] == pytest.approx(10.0 * 0.8 - 9.0)
    # 邻近程度是字面的证据：与匹配程度一样乘闸门，进入全局校准的对数几率
    assert near[0]["proximity"] == 0.25
    assert near[0]["calibrated"] == pytest.approx(10.0 * 0.9 + 4.0 * 0.25 + 2.0 * 0.25 - 9.0)
    # 只有两条候选：比“第 10 名”高出的相似度以最后一名为参照
    assert rows[0]["similarity_lift"] == pytest.approx(0.1) and rows[1]["similarity_lift"] == 0.0


def test_matches_count_only_as_far_as_the_query_is_understood() -> None:
    """覆盖率闸门为 0（另一种语言的问题只匹配上零星的词）时，匹配特征都是 0：模型不会把它当成证据。"""
    evidence = [Evidence(0.9, 0.8, 1, 1, 1), Evidence(0.8, 0.4, 2, 2, 2)]
    full = candidate_features(evidence, coverage=0.9, depth=50)
    half = candidate_features(evidence, coverage=0.45, depth=50, gate=0.5)
    closed = candidate_features(evidence, coverage=0.1, depth=50, gate=0.0)
    assert [r["match"] for r in full] == [0.8, 0.4] and [r["match_share"] for r in full] == [1.0, 0.5]
    assert [r["match"] for r in half] == [0.4, 0.2] and [r["match_share"] for r in half] == [0.5, 0.25]
    assert all(r["match"] == r["match_share"] == 0.0 for r in closed)


def test_fit_logistic_recovers_a_known_curve() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 2))
    p = 1 / (1 + np.exp(-(2.0 * x[:, 0] - 1.0 * x[:, 1] + 0.5)))
    y = (rng.random(4000) < p).astype(float)
    weights, bias = fit_logistic(x, y)
    assert weights == pytest.approx([2.0, -1.0], abs=0.2) and bias == pytest.approx(0.5, abs=0.15)


def test_fitted_model_separates_and_round_trips() -> None:
    rng = np.random.default_rng(1)
    rows, labels = [], []
    for _ in range(300):
        relevant = bool(rng.random() < 0.1)
        similarity = 0.85 + (0.06 if relevant else 0.0) + rng.normal(scale=0.02)
        rows.append({"similarity": similarity, "similarity_gap": similarity - 0.93,
                     "similarity_lift": similarity - 0.84,
                     "vector_rank": math.log1p(1 if relevant else rng.integers(2, 50))})
        labels.append(relevant)
    model = fit_model("vector", rows, labels)
    assert model is not None
    scores = [model.probability(row) for row in rows]
    positive = np.mean([s for s, label in zip(scores, labels, strict=True) if label])
    negative = np.mean([s for s, label in zip(scores, labels, strict=True) if not label])
    assert positive > 0.5 > negative
    assert RelevanceModel.from_dict(model.as_dict()) == model
    # 训练范围之外的取值先截断：极端的相似度不会把概率外推到训练里没见过的地方
    far = {"similarity": 5.0, "similarity_gap": 0.0, "similarity_lift": 0.1, "vector_rank": math.log1p(1)}
    edge = {"similarity": max(row["similarity"] for row in rows), "similarity_gap": 0.0, "similarity_lift": 0.1,
            "vector_rank": math.log1p(1)}
    assert model.probability(far) == pytest.approx(model.probability(edge))


def test_fitted_weights_never_point_against_their_evidence() -> None:
    """标签里有特征之外的东西（同文档的分块算部分相关）时，逻辑回归会拿反向权重去凑：这里的名次特征与相似度
    一起变强时标签反而更低。约束后反向的特征权重为 0，概率随每个证据变强而不降，标签可以是 0~1 的相关程度。"""
    rng = np.random.default_rng(2)
    rows, labels = [], []
    for _ in range(600):
        similarity = rng.uniform(0.7, 0.95)
        rank = rng.integers(1, 40)
        rows.append({"similarity": similarity, "similarity_gap": similarity - 0.95,
                     "similarity_lift": similarity - 0.75, "vector_rank": math.log1p(rank)})
        # 名次越靠后越“相关”：与名次特征应有的方向相反
        labels.append(float(np.clip((similarity - 0.7) * 3 + 0.01 * rank + rng.normal(scale=0.05), 0, 1)))
    model = fit_model("vector", rows, labels)
    assert model is not None and model.revision == MODEL_REVISION
    assert all(weight * FEATURE_SIGNS[name] >= 0 for name, weight in zip(model.features, model.weights, strict=True))
    assert model.weights[model.features.index("vector_rank")] == 0.0
    weak = {"similarity": 0.8, "similarity_gap": -0.15, "similarity_lift": 0.05, "vector_rank": math.log1p(20)}
    stronger = {**weak, "vector_rank": math.log1p(2)}
    assert model.probability(stronger) >= model.probability(weak)


def test_knowledge_bases_under_monotone_chunks_recalibrate_fulltext_only() -> None:
    """不到 MONOTONE_CHUNKS 块的汉字库（别的文字的库不到 SMALL_CHUNKS 块），全文方式只用全局全文曲线的对数几率
    （单调的重新校准）；别的方式、大库、没给分块数时用各自的特征。"""
    small, large = SMALL_MODE_FEATURES["fulltext"], MODE_FEATURES["fulltext"]
    assert mode_features("fulltext", MONOTONE_CHUNKS - 1, "hans") == mode_features("fulltext", 1, "hant") == small
    assert mode_features("fulltext", MONOTONE_CHUNKS, "hans") == mode_features("fulltext") == large
    assert mode_features("fulltext", SMALL_CHUNKS - 1) == small and mode_features("fulltext", SMALL_CHUNKS) == large
    assert all(mode_features(mode, 1, "hans") == MODE_FEATURES[mode] for mode in ("vector", "hybrid"))
    rows = [{"fulltext_calibrated": v / 10} for v in range(-20, 20)]
    labels = [float(v > 5) for v in range(-20, 20)]
    model = fit_model("fulltext", rows, labels, chunks=3)
    assert model is not None and model.features == SMALL_MODE_FEATURES["fulltext"] and model.weights[0] > 0
    assert not model.low and not model.high


@given(st.lists(st.booleans(), max_size=20))
def test_reciprocal_rank(labels: list[bool]) -> None:
    expected = 1 / (labels.index(True) + 1) if True in labels else 0.0
    assert reciprocal_rank(labels) == expected


def test_without_drops_the_answers_and_reranks_what_is_left() -> None:
    evidence = [Evidence(0.9, 0.8, 1, 1, 1), Evidence(0.7, None, 3, None, 2), Evidence(0.8, 0.2, 2, 2, 3)]
    left = without(evidence, [True, False, False])
    assert [(e.similarity, e.vector_rank, e.fulltext_rank, e.fused_rank) for e in left] == [
        (0.7, 2, None, 1), (0.8, 1, 1, 2)]


def test_text_script_and_conversion() -> None:
    from raglib.analysis import in_script, text_script

    assert text_script(["中华人民共和国成立于一九四九年，首都是北京。" * 20]) == "hans"
    assert text_script(["中華人民共和國成立於一九四九年，首都是北京。" * 20]) == "hant"
    assert text_script(["only English text here"] * 50) == "" and text_script(["北京"]) == ""

    # 看够 5,000 个汉字就停，不再读后面的文本：没拟合过的大库每次重读画像时这一步有上限
    read = []

    def texts() -> Iterator[str]:
        for i in range(10_000):
            read.append(i)
            yield "中華人民共和國成立於一九四九年，首都是北京。" * 10
    assert text_script(texts()) == "hant" and len(read) == 25  # 每段 200 个汉字
    assert in_script("投標截止時間是什麼時候", "hans") == "投标截止时间是什么时候"
    assert in_script("投标截止时间是什么时候", "hant") == "投標截止時間是什麼時候"
    assert in_script("When is the deadline?", "hant") == "When is the deadline?"
    assert in_script("投标", "") == "投标"
