"""raglib.postings：Lucene SmallFloat 长度量化、影响力、块的编码与解码、BM25 打分内核、取前 k 名。

不需要数据库：全部对照逐位移植的 Lucene 算法、精确有理数或逐条的纯 Python 参考实现。"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raglib.analysis import QueryTerm
from raglib.bm25 import Bm25Params, ScoredTerm, chunk_score
from raglib.postings import (
    BLOCK_SIZE,
    NORM_LENGTHS,
    TF_MAX,
    Postings,
    bm25_scores,
    capped_tf,
    decode_blocks,
    decode_joined,
    dense_norms,
    encode_blocks,
    impacts,
    norm_bytes,
    quantised_length,
    top_docs,
)

FIELDS = ("terms", "docs", "title_tf", "body_tf", "norms")


def doc_norm(docs: np.ndarray) -> np.ndarray:
    """测试里每个 doc 的长度字节：doc 的确定函数（块不再带长度字节，解码按 doc 查它，同一 doc 的倒排必须相同）。"""
    return ((np.asarray(docs, dtype=np.uint64) * np.uint64(2654435761)) >> np.uint64(7)).astype(np.uint8)


# ---- Lucene SmallFloat 的逐位移植（org.apache.lucene.util.SmallFloat），作为独立的参考 ----

def long_to_int4(i: int) -> int:
    num_bits = i.bit_length()
    if num_bits < 4:
        return i  # 非规格化值：原样
    shift = num_bits - 4
    encoded = (i >> shift) & 0x07  # 保留最高 4 位，最高位隐含
    return encoded | ((shift + 1) << 3)


def int4_to_long(i: int) -> int:
    bits = i & 0x07
    shift = (i >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


NUM_FREE_VALUES = 255 - long_to_int4(2**31 - 1)


def int_to_byte4(i: int) -> int:
    return i if i < NUM_FREE_VALUES else NUM_FREE_VALUES + long_to_int4(i - NUM_FREE_VALUES)


def byte4_to_int(b: int) -> int:
    return b if b < NUM_FREE_VALUES else NUM_FREE_VALUES + int4_to_long(b - NUM_FREE_VALUES)


def test_lucene_constants_and_known_values() -> None:
    assert NUM_FREE_VALUES == 24
    assert [int(x) for x in norm_bytes(np.array([0, 1, 23, 24, 25, 100, 256, 2**31 - 1]))] == [
        0, 1, 23, 24, 25, 57, 70, 255]
    assert quantised_length(100) == 96.0
    assert quantised_length(256) == 248.0
    assert NORM_LENGTHS[255] == 24 + (15 << 27)


def test_norm_lengths_is_byte4_to_int() -> None:
    assert NORM_LENGTHS.dtype == np.float64 and NORM_LENGTHS.shape == (256,)
    assert [int(x) for x in NORM_LENGTHS] == [byte4_to_int(b) for b in range(256)]
    assert np.all(np.diff(NORM_LENGTHS) > 0)


def test_norm_bytes_exact_below_24_and_monotone() -> None:
    lengths = np.arange(0, 70_000)
    codes = norm_bytes(lengths)
    assert codes.dtype == np.uint8
    assert np.array_equal(codes[:24], np.arange(24))
    assert np.array_equal(NORM_LENGTHS[codes[:24]], np.arange(24))
    assert np.all(np.diff(codes.astype(np.int64)) >= 0)
    assert [int(c) for c in codes[:5000]] == [int_to_byte4(i) for i in range(5000)]


def test_negative_and_huge_lengths() -> None:
    assert [int(x) for x in norm_bytes(np.array([-1, -(2**40), 2**40]))] == [0, 0, 255]
    assert quantised_length(-5) == 0.0


@settings(max_examples=300)
@given(length=st.integers(min_value=0, max_value=2**31 - 1))
def test_norm_bytes_matches_lucene_and_rounds_down_within_an_eighth(length: int) -> None:
    code = int(norm_bytes(np.array([length]))[0])
    assert code == int_to_byte4(length)
    decoded = quantised_length(length)
    assert decoded <= length
    assert length - decoded <= length / 8  # 3 位尾数：截断误差不超过 12.5%
    if length < 24:
        assert decoded == length


def test_capped_tf() -> None:
    assert [capped_tf(t) for t in (-3, 0, 1, 255, 256, 10_000)] == [0, 0, 1, 255, TF_MAX, TF_MAX]


@settings(max_examples=300)
@given(title=st.integers(0, 255), body=st.integers(0, 255), norm=st.integers(0, 255))
def test_impacts_match_exact_sql_formula(title: int, body: int, norm: int) -> None:
    """与 fulltext_impact.v1.sql 同一个公式，按精确有理数算（SQL 的 numeric），长度用解码后的值。"""
    got = impacts(np.array([title], np.uint8), np.array([body], np.uint8), np.array([norm], np.uint8))
    tfw = 2 * title + body
    length = Fraction(int(NORM_LENGTHS[norm]))
    expected = math.floor(32767 * Fraction(tfw) / (tfw + Fraction(9, 10) * (Fraction(6, 10) + Fraction(4, 10)
                                                                          * length / 256)))
    assert got.dtype == np.int16
    assert int(got[0]) == expected


def test_impacts_exact_on_integer_boundary() -> None:
    # 32767·81/81.54 恰好是 32550：浮点会算成 32549.99… 再向下取整成 32549
    assert int(impacts(np.array([0]), np.array([81]), np.array([0]))[0]) == 32550


# ---- Postings ----

def test_postings_coerces_dtypes_and_validates() -> None:
    p = Postings(np.array([1, 2]), np.array([5, -6]), np.array([1, 2]), np.array([3, 4]), np.array([0, 9]))
    assert [getattr(p, f).dtype for f in FIELDS] == [np.int32, np.int64, np.uint8, np.uint8, np.uint8]
    with pytest.raises(ValueError, match="title_tf"):
        Postings(np.array([1]), np.array([5]), np.array([300]), np.array([3]), np.array([0]))
    with pytest.raises(ValueError, match="等长"):
        Postings(np.array([1, 2]), np.array([5]), np.array([1]), np.array([3]), np.array([0]))
    with pytest.raises(ValueError, match="整数"):
        Postings(np.array([1.5]), np.array([5]), np.array([1]), np.array([3]), np.array([0]))


def test_postings_concat_and_filters() -> None:
    a = Postings(np.array([1, 2, 3]), np.array([10, 20, 30]), np.array([1, 0, 0]), np.array([1, 2, 3]),
                 np.array([5, 5, 5]))
    b = Postings(np.array([1]), np.array([40]), np.array([0]), np.array([7]), np.array([6]))
    both = Postings.concat([a, b])
    assert len(both) == 4 and both.docs.tolist() == [10, 20, 30, 40]
    assert len(Postings.concat([])) == 0 and len(Postings.empty()) == 0
    assert both.without_docs(np.array([20, 40])).docs.tolist() == [10, 30]
    assert both.only_terms(np.array([1])).docs.tolist() == [10, 40]
    assert both.only_terms(np.array([1])).body_tf.tolist() == [1, 7]


# ---- 块的构建与解码 ----

@st.composite
def postings_data(draw: Any) -> Postings:
    """随机倒排：(词, doc) 不重复；doc 的范围决定差值宽度（1、2、4 字节都覆盖到）；条数足以让常见词跨多块。

    数组用 hypothesis 抽的种子在 numpy 里生成：几百条倒排逐条让 hypothesis 抽太慢。"""
    n = draw(st.integers(0, 700))
    n_terms = draw(st.integers(1, 4))
    doc_high = draw(st.sampled_from([200, 5_000, 70_000, 2**32]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    terms = rng.integers(-2, -2 + n_terms, n)  # 词 id 可以是负数
    docs = rng.integers(0, min(doc_high, 2**32), n)
    pairs = np.unique(np.stack([terms, docs], axis=1), axis=0)
    pairs = pairs[rng.permutation(len(pairs))]
    m = len(pairs)
    title = np.minimum(rng.integers(0, 301, m) * (rng.random(m) < 0.3), TF_MAX)  # 多数分块标题里没有这个词
    body = np.minimum(rng.integers(0, 301, m) // rng.integers(1, 60, m), TF_MAX)
    return Postings(pairs[:, 0], pairs[:, 1], title, body, doc_norm(pairs[:, 1]))


def canonical(p: Postings) -> np.ndarray:
    """按 (词, doc) 排好的 5 列矩阵：(词, doc) 不重复，所以这就是倒排多重集的标准形式。"""
    order = np.lexsort((p.docs, p.terms))
    return np.stack([getattr(p, f)[order].astype(np.int64) for f in FIELDS], axis=1)


@dataclass(frozen=True)
class Block:
    """一块倒排（encode_blocks 按列给出的结果，逐块拆开方便断言）。"""

    term: int
    number: int
    max_impact: int
    count: int
    data: bytes


def build_blocks(p: Postings) -> list[Block]:
    encoded = encode_blocks(p)
    raw = encoded.raw.tobytes()
    return [Block(term, number, max_impact, count, raw[start:start + size])
            for term, number, max_impact, count, start, size
            in zip(encoded.terms.tolist(), encoded.numbers.tolist(), encoded.max_impacts.tolist(),
                   encoded.counts.tolist(), encoded.offsets.tolist(), encoded.sizes.tolist(), strict=True)]


def check_blocks(p: Postings, blocks: list[Block]) -> None:
    assert canonical(decode_blocks([(b.term, b.data) for b in blocks], doc_norm)).tolist() == canonical(p).tolist()
    assert [(b.term, b.number) for b in blocks] == sorted((b.term, b.number) for b in blocks)

    # 期望的切法：每个词按 (影响力降序, doc 升序) 排好，每 BLOCK_SIZE 条一块
    imp = impacts(p.title_tf, p.body_tf, p.norms).astype(np.int64)
    by_term: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for term, doc, value in zip(p.terms.tolist(), p.docs.tolist(), imp.tolist(), strict=True):
        by_term[term].append((-value, doc))
    expected = {}
    for term, items in by_term.items():
        items.sort()
        for number in range(0, len(items), BLOCK_SIZE):
            chunk = items[number:number + BLOCK_SIZE]
            expected[term, number // BLOCK_SIZE] = ([doc for _, doc in chunk], -chunk[0][0])
    assert {(b.term, b.number) for b in blocks} == set(expected)

    for block in blocks:
        decoded = decode_blocks([(block.term, block.data)], doc_norm)
        docs, max_impact = expected[block.term, block.number]
        assert 1 <= block.count <= BLOCK_SIZE and block.count == len(decoded)
        assert decoded.docs.tolist() == sorted(docs)  # 块内按 doc 升序
        assert block.max_impact == max_impact == int(impacts(decoded.title_tf, decoded.body_tf, decoded.norms).max())
        # 数据格式：第一个 doc 是 uint32 小端；差值按字节（宽度是装得下最大差值的最小者）或按位打包（位数同理，
        # 块头 0x80，条数 - 1 与位数各一字节），哪个连块头算更小用哪个；标题词频全 0、正文词频全 1 的块省掉那一节
        # 并在块头记下；长度字节一律不在块里（0x10）；长度与条数、宽度、节数一致
        head, largest = block.data[0], int(np.diff(decoded.docs).max(initial=0))
        no_title, body_ones = bool(head & 0x40), bool(head & 0x20)
        width, bits = next(w for w in (1, 2, 4) if largest < 256**w), largest.bit_length()
        by_bytes, by_bits = (block.count - 1) * width, 2 + math.ceil((block.count - 1) * bits / 8)
        assert head & ~0xF7 == 0 and head & 0x10
        assert no_title == bool((decoded.title_tf == 0).all()) and body_ones == bool((decoded.body_tf == 1).all())
        assert int.from_bytes(block.data[1:5], "little") == decoded.docs[0]
        if head & 0x80:
            assert head & 0x07 == 0 and by_bits < by_bytes and list(block.data[5:7]) == [block.count - 1, bits]
        else:
            assert head & 0x07 == width and by_bits >= by_bytes
        assert len(block.data) == 5 + min(by_bytes, by_bits) + (2 - no_title - body_ones) * block.count

    # 同一个词：块号 n 的每条倒排影响力都不低于块号 n+1 的任何一条
    for block, after in itertools.pairwise(blocks):
        if block.term == after.term:
            assert after.number == block.number + 1 and block.count == BLOCK_SIZE
            lower = decode_blocks([(block.term, block.data)], doc_norm)
            upper = decode_blocks([(after.term, after.data)], doc_norm)
            assert impacts(lower.title_tf, lower.body_tf, lower.norms).min() >= after.max_impact
            assert block.max_impact >= after.max_impact
            assert len(upper) == after.count


@settings(max_examples=150, deadline=None)
@given(p=postings_data())
def test_blocks_round_trip_and_are_cut_by_impact(p: Postings) -> None:
    check_blocks(p, build_blocks(p))


def test_long_term_spans_many_blocks_and_every_delta_layout() -> None:
    rng = np.random.default_rng(7)
    dense = rng.permutation(1000)  # 1000 个连续 doc：每块 128 条散在其中，差值几位，按位打包
    sparse = rng.permutation(256) * 2**24  # 差值至少 2^24、最大的 doc 贴近 2^32：按 25~32 位打包
    # 一块装得下的词，差值整齐：正好 8 位（按位打包省不下块头的两字节，按 1 字节）、正好 16 位（2 字节）；
    # 两条倒排差 2^32 - 1（4 字节）
    ones, twos, fours = np.arange(100) * 200, np.arange(100) * 40_000, np.array([0, 2**32 - 1])
    docs = np.concatenate([dense, sparse, ones, twos, fours])
    terms = np.repeat([5, 7, 9, 11, 13], [1000, 256, 100, 100, 2])
    p = Postings(terms, docs, rng.integers(0, 3, docs.size), rng.integers(0, 256, docs.size), doc_norm(docs))
    blocks = build_blocks(p)
    assert [b.number for b in blocks if b.term == 5] == list(range(8))
    layouts: dict[int, set[int]] = defaultdict(set)
    for block in blocks:
        layouts[block.term].add(block.data[0] & 0x87)
    assert layouts == {5: {0x80}, 7: {0x80}, 9: {1}, 11: {2}, 13: {4}}
    assert max(b.data[6] for b in blocks if b.term == 7) > 24
    check_blocks(p, blocks)
    # 块与块以任意顺序解码，得到同一个多重集
    shuffled = [(b.term, b.data) for b in reversed(blocks)]
    assert canonical(decode_blocks(shuffled, doc_norm)).tolist() == canonical(p).tolist()


def test_block_edge_cases() -> None:
    assert build_blocks(Postings.empty()) == []
    assert len(decode_blocks([])) == 0
    top = 2**32 - 1
    p = Postings(np.array([3, 3]), np.array([0, top]), np.array([0, 0]), np.array([1, 1]), doc_norm([0, top]))
    (block,) = build_blocks(p)
    assert block.data == b"\x74" + bytes(4) + top.to_bytes(4, "little")  # 只剩块头、第一个 doc 与差值
    assert decode_blocks([(3, block.data)], doc_norm).docs.tolist() == [0, top]


def test_blocks_of_every_earlier_layout_still_decode() -> None:
    """落盘格式逐字节钉住。2026-11-29 以前写的块：块头只有宽度，三节都在；2026-11-29 到 30 日写的：省掉全 0 的
    标题、全 1 的正文两节，长度字节还在块里；现在的写法连长度字节也不带（0x10），解码按 doc 查段里的。
    同样的倒排几种字节解出来相同，旧块不用给长度字节的查法，新旧块混在一起解也行。"""
    norms = dense_norms(7, np.array([5, 0, 6], dtype=np.uint8))  # 序号 7、8、9
    p = Postings(np.array([1, 1]), np.array([7, 9]), np.array([0, 0]), np.array([1, 1]), np.array([5, 6]))
    oldest = b"\x01" + (7).to_bytes(4, "little") + b"\x02" + b"\x00\x00" + b"\x01\x01" + b"\x05\x06"
    flagged = b"\x61" + (7).to_bytes(4, "little") + b"\x02" + b"\x05\x06"
    (block,) = build_blocks(p)
    assert block.data == b"\x71" + (7).to_bytes(4, "little") + b"\x02"
    for data in (oldest, flagged):
        assert canonical(decode_blocks([(1, data)])).tolist() == canonical(p).tolist()
    assert canonical(decode_blocks([(1, block.data)], norms)).tolist() == canonical(p).tolist()
    mixed = decode_blocks([(1, oldest), (1, block.data), (1, flagged)], norms)
    assert canonical(mixed).tolist() == canonical(Postings.concat([p, p, p])).tolist()
    # 只有标题一节省掉（正文词频有 2）、只有正文一节省掉（标题词频有 1）
    titled = Postings(np.array([1, 1]), np.array([7, 9]), np.array([0, 1]), np.array([1, 1]), np.array([5, 6]))
    repeated = Postings(np.array([1, 1]), np.array([7, 9]), np.array([0, 0]), np.array([2, 1]), np.array([5, 6]))
    assert build_blocks(titled)[0].data[0] == 0x31 and build_blocks(repeated)[0].data[0] == 0x51
    for q in (titled, repeated):
        assert canonical(decode_blocks([(1, build_blocks(q)[0].data)], norms)).tolist() == canonical(q).tolist()
    # 差值按位打包（0x80）：9 条连续的 doc，8 个差值各 1 位；块头之后是条数 - 1、位数，再是打包的差值
    run = Postings(np.full(9, 1), np.arange(9), np.zeros(9, np.uint8), np.ones(9, np.uint8), np.zeros(9, np.uint8))
    (block,) = build_blocks(run)
    assert block.data == b"\xf0" + bytes(4) + b"\x08\x01\xff"
    assert canonical(decode_blocks([(1, block.data)], dense_norms(0, np.zeros(9, np.uint8)))).tolist() == \
        canonical(run).tolist()


def test_blocks_without_norms_need_the_segments_norms() -> None:
    (block,) = build_blocks(Postings(np.array([1]), np.array([7]), np.array([0]), np.array([1]), np.array([5])))
    with pytest.raises(ValueError, match="给出 norms"):
        decode_blocks([(1, block.data)])
    with pytest.raises(ValueError, match="序号范围"):  # 块里的 doc 不在给出的段里：不读到别处去
        decode_blocks([(1, block.data)], dense_norms(8, np.array([5], dtype=np.uint8)))


def test_duplicate_term_doc_raises() -> None:
    # 两条同 (词, doc) 的倒排影响力不同，在影响力顺序里并不相邻，也要查出来
    terms = np.array([1, 1, 1, 2])
    docs = np.array([7, 8, 7, 7])
    p = Postings(terms, docs, np.array([0, 0, 5, 0]), np.array([1, 9, 200, 1]), np.array([3, 3, 3, 3]))
    with pytest.raises(ValueError, match="不止一次"):
        build_blocks(p)


@pytest.mark.parametrize("doc", [-1, 2**32])
def test_out_of_range_docs_raise(doc: int) -> None:
    p = Postings(np.array([1]), np.array([doc]), np.array([0]), np.array([1]), np.array([0]))
    with pytest.raises(ValueError, match="2\\^32"):
        build_blocks(p)


@pytest.mark.parametrize("data", [b"\x01\x00\x00", b"\x03" + bytes(7), b"\x01" + bytes(8), b"\x81" + bytes(7),
                                  b"\x61" + bytes(4), b"\xf0" + bytes(4) + b"\x08\x00\xff",
                                  b"\xf0" + bytes(4) + b"\x08\x21" + bytes(33), b"\xf0" + bytes(4) + b"\x08\x01",
                                  b"\xf1" + bytes(4) + b"\x08\x01\xff", b"\x08" + bytes(7)])
def test_corrupt_block_data_raises(data: bytes) -> None:
    with pytest.raises(ValueError, match="块数据"):
        decode_blocks([(1, data)])


def test_joined_blocks_decode_like_separate_blocks_and_check_their_lengths() -> None:
    docs = np.array([1, 9, 4])
    p = Postings(np.array([3, 3, 5]), docs, np.array([0, 1, 2]), np.array([1, 2, 3]), doc_norm(docs))
    blocks = build_blocks(p)
    joined = b"".join(block.data for block in blocks)
    lengths = np.array([len(block.data) for block in blocks])
    terms = np.array([block.term for block in blocks])
    assert canonical(decode_joined(joined, lengths, terms, doc_norm)).tolist() == canonical(p).tolist()
    with pytest.raises(ValueError, match="块数据"):
        decode_joined(joined + b"\x00", lengths, terms, doc_norm)


# ---- BM25 打分内核 ----

@st.composite
def scoring_case(draw: Any) -> tuple[Postings, dict[int, int], list[float], dict[str, float]]:
    """doc 可以是负数（未压实的分块）；同一 doc 的各条倒排长度字节相同；几个词可以共用一个词位（前缀词）。"""
    n_docs = draw(st.integers(1, 25))
    doc_ids = draw(st.lists(st.integers(-(2**40), 2**40), min_size=n_docs, max_size=n_docs, unique=True))
    doc_norms = draw(st.lists(st.integers(0, 255), min_size=n_docs, max_size=n_docs))
    pairs = draw(st.lists(st.tuples(st.integers(0, n_docs - 1), st.integers(0, 7)), max_size=80, unique=True))
    tfs = draw(st.lists(st.tuples(st.integers(0, 255), st.integers(0, 255)), min_size=len(pairs),
                        max_size=len(pairs)))
    n_slots = draw(st.integers(1, 4))
    slots = draw(st.dictionaries(st.integers(0, 9), st.integers(0, n_slots - 1), max_size=8))
    weights = draw(st.lists(st.floats(0.01, 20), min_size=n_slots, max_size=n_slots))
    params = {"k1": draw(st.floats(0, 3)), "b": draw(st.floats(0, 1)), "avgdl": draw(st.floats(0, 2000)),
              "title_weight": draw(st.floats(0, 5))}
    p = Postings(np.array([t for _, t in pairs], dtype=np.int32), np.array([doc_ids[d] for d, _ in pairs]),
                 np.array([t for t, _ in tfs]), np.array([b for _, b in tfs]),
                 np.array([doc_norms[d] for d, _ in pairs]))
    return p, slots, weights, params


def naive_scores(p: Postings, slots: dict[int, int], weights: list[float], *, k1: float, b: float,
                 avgdl: float, title_weight: float) -> dict[int, float]:
    tf: dict[tuple[int, int], float] = defaultdict(float)
    length: dict[int, float] = {}
    for term, doc, title, body, norm in zip(*(getattr(p, f).tolist() for f in FIELDS), strict=True):
        if term in slots:
            tf[slots[term], doc] += title_weight * title + body
            length[doc] = float(NORM_LENGTHS[norm])
    scores = dict.fromkeys(length, 0.0)
    for (slot, doc), value in tf.items():
        denominator = value + k1 * (1 - b) + k1 * b * length[doc] / max(avgdl, 1e-9)
        if value > 0:
            scores[doc] += weights[slot] * value / denominator
    return scores


@settings(max_examples=300, deadline=None)
@given(case=scoring_case())
def test_bm25_scores_match_naive_reference(case: tuple[Postings, dict[int, int], list[float],
                                                       dict[str, float]]) -> None:
    p, slots, weights, params = case
    docs, scores = bm25_scores(p, slots, weights, **params)
    expected = naive_scores(p, slots, weights, **params)
    assert docs.dtype == np.int64 and scores.dtype == np.float64
    assert docs.tolist() == sorted(expected)
    for doc, score in zip(docs.tolist(), scores.tolist(), strict=True):
        assert math.isclose(score, expected[doc], rel_tol=1e-9, abs_tol=1e-300)



@pytest.mark.parametrize("spread", [10, 2**55, 2**61])
@pytest.mark.parametrize("slotting", ["none", "identity", "mapped"])
def test_bm25_scores_every_sort_path_matches_the_reference(spread: int, slotting: str) -> None:
    """doc 的跨度决定排序的路子（下标拼进键里直接排、argsort、lexsort），倒排按词位标号（检索时，slots 为 None
    或恒等映射）还是经 slots 查表：各种组合的结果都与直白写法相同；不查表的与恒等映射的逐位相同。"""
    identity = slotting != "mapped"
    rng = np.random.default_rng(spread % 97 + identity)
    n = 300
    docs = rng.integers(-spread, spread, 40)[rng.integers(0, 40, n)]
    terms = rng.integers(0, 3, n) if identity else rng.integers(5, 9, n)
    keep = np.unique(np.stack([terms, docs]), axis=1, return_index=True)[1]  # 同一 (词, doc) 只留一条
    norms = (docs % 256 + 256) % 256
    p = Postings(terms[keep], docs[keep], rng.integers(0, 3, keep.size), rng.integers(0, 9, keep.size), norms[keep])
    slots = {0: 0, 1: 1, 2: 2} if identity else {5: 0, 6: 0, 7: 2}
    params = {"k1": 1.2, "b": 0.75, "avgdl": 120.0, "title_weight": 2.0}
    docs_out, scores = bm25_scores(p, None if slotting == "none" else slots, [1.5, 0.7, 2.2], **params)
    expected = naive_scores(p, slots, [1.5, 0.7, 2.2], **params)
    assert docs_out.tolist() == sorted(expected)
    for doc, score in zip(docs_out.tolist(), scores.tolist(), strict=True):
        assert math.isclose(score, expected[doc], rel_tol=1e-9)
    if slotting == "none":
        mapped_docs, mapped_scores = bm25_scores(p, slots, [1.5, 0.7, 2.2], **params)
        assert np.array_equal(docs_out, mapped_docs) and np.array_equal(scores, mapped_scores)

LEXEMES = ["ab", "abc", "ac", "b", "ba"]  # 词 id 即下标


@settings(max_examples=200, deadline=None)
@given(counts=st.dictionaries(st.tuples(st.integers(0, 4), st.integers(0, 4)),
                              st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=1),
       lengths=st.lists(st.integers(0, 3000), min_size=5, max_size=5))
def test_bm25_scores_agree_with_chunk_score(counts: dict[tuple[int, int], tuple[int, int]],
                                            lengths: list[int]) -> None:
    """前缀词 ``a`` 覆盖 ab、abc、ac，精确词 ``b`` 只是 b：与 raglib.bm25.chunk_score 逐块一致。"""
    params = Bm25Params(k1=1.2, b=0.75, title_weight=2.0)
    query = [ScoredTerm(QueryTerm("a", prefix=True), 3, 1.5, 1.5 * 2.2), ScoredTerm(QueryTerm("b"), 2, 0.7, 0.7 * 2.2)]
    slots = {0: 0, 1: 0, 2: 0, 3: 1}  # ba（4）不在查询里
    keys = sorted(counts)
    p = Postings(np.array([t for _, t in keys]), np.array([d for d, _ in keys]),
                 np.array([counts[k][0] for k in keys]), np.array([counts[k][1] for k in keys]),
                 norm_bytes(np.array([lengths[d] for d, _ in keys])))
    docs, scores = bm25_scores(p, slots, [s.weight for s in query], k1=params.k1, b=params.b, avgdl=300.0,
                               title_weight=params.title_weight)
    for doc, score in zip(docs.tolist(), scores.tolist(), strict=True):
        chunk = {LEXEMES[t]: counts[d, t] for d, t in keys if d == doc}
        expected = chunk_score(query, chunk, int(quantised_length(lengths[doc])), params, 300.0)
        assert math.isclose(score, expected, rel_tol=1e-9, abs_tol=1e-300)
    assert set(docs.tolist()) == {d for d, t in keys if t in slots}


def test_bm25_scores_without_matches() -> None:
    p = Postings(np.array([1]), np.array([5]), np.array([0]), np.array([1]), np.array([0]))
    for slots in ({}, {2: 0}):
        docs, scores = bm25_scores(p, slots, [1.0], k1=1.2, b=0.75, avgdl=100.0, title_weight=2.0)
        assert docs.size == 0 and scores.size == 0 and docs.dtype == np.int64
    docs, scores = bm25_scores(Postings.empty(), {1: 0}, [1.0], k1=1.2, b=0.75, avgdl=100.0, title_weight=2.0)
    assert docs.size == 0


@pytest.mark.parametrize("slot", [-1, 1])
def test_bm25_rejects_slots_without_weight(slot: int) -> None:
    p = Postings(np.array([1]), np.array([5]), np.array([0]), np.array([1]), np.array([0]))
    with pytest.raises(ValueError, match="词位"):
        bm25_scores(p, {1: slot}, [1.0], k1=1.2, b=0.75, avgdl=100.0, title_weight=2.0)
    # 不查表时倒排的词号本身就是词位，同样要有权重
    unmapped = Postings(np.array([slot]), np.array([5]), np.array([0]), np.array([1]), np.array([0]))
    with pytest.raises(ValueError, match="词位"):
        bm25_scores(unmapped, None, [1.0], k1=1.2, b=0.75, avgdl=100.0, title_weight=2.0)


def test_bm25_zero_tf_with_zero_denominator_scores_zero() -> None:
    # b=1、长度 0、tf=0：分母为 0，这一项按 0 计而不是 NaN；doc 仍在结果里（它有一条倒排落在词位上）
    p = Postings(np.array([1, 1]), np.array([5, 6]), np.array([0, 0]), np.array([0, 2]), np.array([0, 0]))
    docs, scores = bm25_scores(p, {1: 0}, [2.0], k1=1.2, b=1.0, avgdl=100.0, title_weight=2.0)
    assert docs.tolist() == [5, 6] and scores.tolist() == [0.0, 2.0]


# ---- 前 k 名 ----

@settings(max_examples=300)
@given(items=st.dictionaries(st.integers(-1000, 1000), st.sampled_from([0.0, 0.5, 1.0, 2.5, 3.0]), max_size=40),
       k=st.integers(-1, 45))
def test_top_docs_orders_by_score_then_doc(items: dict[int, float], k: int) -> None:
    docs = np.array(list(items), dtype=np.int64)
    scores = np.array(list(items.values()), dtype=np.float64)
    top, top_scores = top_docs(docs, scores, k)
    expected = sorted(items.items(), key=lambda kv: (-kv[1], kv[0]))[:max(k, 0)]
    assert top.tolist() == [d for d, _ in expected]
    assert top_scores.tolist() == [s for _, s in expected]
