"""查询词的邻近程度（raglib.proximity）：最集中的一句话装下了查询的多少。"""

from __future__ import annotations

import pytest

from raglib import analysis
from raglib.proximity import sentence_share


def _weights(query: str) -> dict[str, float]:
    return {term.lexeme: 1.0 for term in analysis.parse_query(query, analyzer="bigram").terms}


def test_terms_in_one_sentence_beat_the_same_terms_spread_over_the_chunk() -> None:
    weights = _weights("Which river flows in Paris")
    together = "Paris lies on a plain. The Seine river flows through Paris from east to west."
    spread = "The river is long. Water flows north. Paris is a city."
    assert sentence_share(together, weights) == 1.0
    assert sentence_share(spread, weights) == pytest.approx(1 / 3)


def test_words_match_by_stem_and_whole_word_only() -> None:
    """英文按词干认词（flowing → flow），词首、词尾都要是词的边界：overflows 不是 flows，rivers 是 river。"""
    weights = _weights("river flows")
    assert sentence_share("Rivers were flowing.", weights) == 1.0
    assert sentence_share("It overflows; the riverbank.", weights) == 0.0


def test_chinese_bigrams_sentences_and_weights() -> None:
    """汉字按字二元找；句末标点分句，小数点不分；权重大的词占的份额大。"""
    weights = {"长江": 3.0, "流经": 1.0}
    assert sentence_share("长江发源于青海。它流经上海。", weights) == 0.75
    assert sentence_share("长江流经 3.5 个省", weights) == 1.0
    assert sentence_share("黄河", weights) == 0.0
    assert sentence_share("长江", {}) == 0.0


def test_traditional_text_is_normalised_like_the_index() -> None:
    """原文与查询一样先归一化（繁 → 简、全角 → 半角、小写）。"""
    assert sentence_share("長江流經ＳＨＡＮＧＨＡＩ。", _weights("长江流经 shanghai")) == 1.0


def test_a_hard_line_break_inside_a_sentence_does_not_end_it() -> None:
    """PDF 转出的正文每行硬换行：句子与分块器的同一个定义，单个换行不断句；空行、标题行照样断。"""
    weights = _weights("Which river flows in Paris")
    wrapped = "The Seine river flows\nthrough Paris from east to west."
    assert sentence_share(wrapped, weights) == 1.0
    assert sentence_share("The Seine river\n\nflows through Paris.", weights) == pytest.approx(2 / 3)
    assert sentence_share("# The Seine river\nflows through Paris.", weights) == pytest.approx(2 / 3)
