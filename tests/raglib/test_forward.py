"""分块的正排（raglib.forward）：原样还原词位与截断后的词频，坏数据报“正排损坏”而不是读出别的词。"""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raglib.forward import ForwardTerms, decode, encode

_lexeme = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)


@given(st.lists(st.tuples(_lexeme, st.integers(0, 400), st.integers(0, 400)), max_size=60))
def test_round_trip_caps_term_frequencies_at_one_byte(terms):
    data = encode([t[0] for t in terms], [t[1] for t in terms], [t[2] for t in terms])
    decoded = decode(data)
    assert decoded.lexemes == [t[0] for t in terms]
    assert list(decoded.title_tf) == [min(t[1], 255) for t in terms]
    assert list(decoded.body_tf) == [min(t[2], 255) for t in terms]


def test_counts_and_the_empty_chunk():
    data = encode(["中国", "run", "国人"], [1, 0, 0], [2, 1, 300])
    assert decode(data).counts() == {"中国": (1, 2), "run": (0, 1), "国人": (0, 255)}
    assert decode(encode([], [], [])) == ForwardTerms([], b"", b"")


def test_chinese_lexemes_take_two_bytes_per_character():
    raw = zlib.decompress(encode(["中国"], [0], [1]))
    assert raw == b"\x01\x00\x00\x00" + "中国".encode("gb18030") + b"\x00\x01\x00"
    assert len("中国".encode("gb18030")) == 4


@pytest.mark.parametrize("data", [b"", b"not zlib", zlib.compress(b"\x05\x00\x00\x00ab\x00\x01\x00"),
                                  zlib.compress(b"\x02\x00\x00\x00ab\x00\x01\x00\x00\x00"),
                                  zlib.compress(b"\x01")])
def test_corrupt_data_is_rejected(data):
    with pytest.raises(ValueError, match="正排损坏"):
        decode(data)


def test_encode_rejects_mismatched_lengths_and_nul():
    with pytest.raises(ValueError, match="length"):
        encode(["a"], [], [1])
    with pytest.raises(ValueError, match="U\\+0000"):
        encode(["a\0b"], [0], [1])
