"""段的词典（raglib.lexicon）：词典块的编码往返、查找、罕见词内联，整个段的写出与读回。"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from raglib.lexicon import (
    DICTIONARY_BLOCK_BYTES,
    INLINE_MAX_BYTES,
    PACKED,
    DictionaryBlock,
    Entry,
    build_segment,
    decode_dictionary_block,
    encode_dictionary,
    prefix_dfs,
    read_segment,
    unpack_dictionary_block,
)
from raglib.postings import BLOCK_SIZE, Postings

LEXEMES = st.text(alphabet=st.sampled_from(list("abc肝功能乙高血压'é")), min_size=1, max_size=6)


def _norms(docs: np.ndarray) -> np.ndarray:
    """测试里每个 doc 的长度字节（块里不存它，读段时按 doc 查：同一 doc 的各条倒排相同）。"""
    return (np.asarray(docs, dtype=np.int64) * 37 % 256).astype(np.uint8)


def _postings(rows: list[tuple[int, int, int, int]]) -> Postings:
    """(词, doc, 标题词频, 正文词频) 的行 → 倒排，长度字节取 :func:`_norms`。"""
    terms, docs, title, body = zip(*rows, strict=True) if rows else ((), (), (), ())
    docs_array = np.array(docs, dtype=np.int64)
    return Postings(np.array(terms, dtype=np.int32), docs_array, np.array(title, dtype=np.uint8),
                    np.array(body, dtype=np.uint8), _norms(docs_array))


def _as_set(lexemes: list[str], postings: Postings) -> set[tuple[str, int, int, int, int]]:
    return {(lexemes[t], d, a, b, n) for t, d, a, b, n in zip(postings.terms.tolist(), postings.docs.tolist(),
                                                               postings.title_tf.tolist(), postings.body_tf.tolist(),
                                                               postings.norms.tolist(), strict=True)}


@given(st.lists(st.tuples(LEXEMES, st.integers(1, 10**6), st.one_of(st.none(), st.binary(min_size=8, max_size=90))),
                unique_by=lambda x: x[0], max_size=300))
def test_dictionary_blocks_round_trip_in_lexeme_order(raw: list[tuple[str, int, bytes | None]]) -> None:
    entries = sorted((Entry(lexeme, df, inline) for lexeme, df, inline in raw), key=lambda e: e.lexeme)
    blocks = encode_dictionary(entries)
    decoded = [entry for _, data in blocks for entry in decode_dictionary_block(data)]
    assert decoded == entries
    # 每块以它的第一个词命名，块与块按词位有序：查找 = 取 first_lexeme ≤ 词的最后一块
    assert [first for first, _ in blocks] == sorted(first for first, _ in blocks)
    for first, data in blocks:
        assert decode_dictionary_block(data)[0].lexeme == first
        # 单个词超过目标大小时一块只放它一个；否则块不超过目标大小
        assert len(data) <= DICTIONARY_BLOCK_BYTES + 16 or len(decode_dictionary_block(data)) == 1
    for entry in entries:
        block = max((b for b in blocks if b[0] <= entry.lexeme), key=lambda b: b[0])
        reader = DictionaryBlock(block[1])
        assert reader.find(entry.lexeme) == entry
        assert reader.entries() and reader.find(entry.lexeme) == entry  # 算过前缀和之后走另一条路
    assert all(DictionaryBlock(data).find("\U0010ffff") is None for _, data in blocks)
    # 前缀：一个块里以它开头的词正好是那一段
    for prefix in ("a", "肝", "乙高"):
        found = [e for _, data in blocks for e in DictionaryBlock(data).with_prefix(prefix)]
        assert found == [e for e in entries if e.lexeme.startswith(prefix)]


@hsettings(max_examples=50)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 400), st.integers(0, 3), st.integers(0, 9)),
                unique_by=lambda r: (r[0], r[1]), max_size=600))
def test_a_segment_reads_back_its_postings(rows: list[tuple[int, int, int, int]]) -> None:
    lexemes = sorted({f"词{t:02d}" for t in range(31)})
    postings = _postings(rows)
    segment = build_segment(lexemes, postings)
    read_lexemes, read_postings = read_segment([data for _, data in segment.dictionary],
                                               [(lexeme, data) for lexeme, _, data in segment.blocks], norms=_norms)
    assert _as_set(read_lexemes, read_postings) == _as_set(lexemes, postings)
    entries = [entry for _, data in segment.dictionary for entry in decode_dictionary_block(data)]
    counts = np.bincount(postings.terms, minlength=len(lexemes)) if rows else np.zeros(len(lexemes), int)
    assert {e.lexeme: e.df for e in entries} == {lexemes[t]: int(c) for t, c in enumerate(counts) if c}
    for entry in entries:
        if entry.inline is not None:
            assert len(entry.inline) <= INLINE_MAX_BYTES and entry.df <= BLOCK_SIZE
        else:
            assert len([b for b in segment.blocks if b[0] == entry.lexeme]) == entry.blocks


def test_rare_terms_are_inlined_and_common_terms_get_blocks() -> None:
    rows = [(0, doc, 0, 1) for doc in range(300)] + [(1, 7, 1, 0)]
    segment = build_segment(["common", "rare"], _postings(rows))
    entries = {e.lexeme: e for _, data in segment.dictionary for e in decode_dictionary_block(data)}
    assert entries["rare"].inline is not None and entries["rare"].df == 1
    assert entries["common"].inline is None and entries["common"].blocks == 3
    assert sorted((lexeme, number) for lexeme, number, _ in segment.blocks) == [("common", n) for n in range(3)]


def _greedy_cut(entries: list[Entry]) -> list[int]:
    """词典块切法的定义（逐词累加，加上这个词超过目标大小就开新块，一块至少一个词）：每块的词数。"""
    sizes: list[int] = []
    size = 0
    for entry in entries:
        cost = len(entry.lexeme.encode("utf-8")) + 7 + len(entry.inline or b"")
        if sizes and size + cost > DICTIONARY_BLOCK_BYTES:
            sizes.append(0)
            size = 0
        if not sizes:
            sizes.append(0)
        sizes[-1] += 1
        size += cost
    return sizes


def test_stored_dictionary_blocks_are_compressed_and_old_plain_blocks_still_read() -> None:
    # 典型的词典：汉字 bigram、多数 df 为 1、罕见词的短倒排内联
    entries = [Entry(chr(0x4E00 + i // 40) + chr(0x4E00 + i % 40 * 7), 1 + i % 3, bytes([i % 5 + 1, 0, 1]))
               for i in range(600)]
    blocks = encode_dictionary(entries)
    assert len(blocks) > 1
    for _, stored in blocks:
        assert stored[0] == PACKED
        plain = unpack_dictionary_block(stored)
        assert len(stored) < 0.7 * len(plain)
        # 压缩之前写下的块（未压缩）照样能读，读出的与压缩块相同
        assert unpack_dictionary_block(plain) == plain
        assert decode_dictionary_block(plain) == decode_dictionary_block(stored)
        assert DictionaryBlock(plain).entries() == DictionaryBlock(stored).entries()
    # 合并读旧段：未压缩的词典块与压缩的读出同一个段
    lexemes = sorted({entry.lexeme for entry in entries})
    terms = np.arange(len(lexemes), dtype=np.int32)
    postings = Postings(terms, terms.astype(np.int64) % 50, np.zeros(len(terms), np.uint8),
                        np.ones(len(terms), np.uint8), _norms(terms % 50))
    segment = build_segment(lexemes, postings)
    stored_rows = [data for _, data in segment.dictionary]
    plain_rows = [unpack_dictionary_block(data) for data in stored_rows]
    assert plain_rows != stored_rows
    expected = _as_set(lexemes, postings)
    plain, stored = read_segment(plain_rows, [], norms=_norms), read_segment(stored_rows, [], norms=_norms)
    assert _as_set(*plain) == _as_set(*stored) == expected


@given(st.lists(st.tuples(st.text(min_size=1, max_size=400).filter(lambda s: "\x00" not in s),
                          st.one_of(st.none(), st.binary(min_size=8, max_size=INLINE_MAX_BYTES))),
                unique_by=lambda x: x[0], max_size=200))
def test_dictionary_blocks_are_cut_like_the_greedy_definition(raw: list[tuple[str, bytes | None]]) -> None:
    # 按列一次切块（合并的快路）与逐词累加的定义切在同样的地方：落盘格式不因写法改变
    entries = sorted((Entry(lexeme, 1, inline) for lexeme, inline in raw), key=lambda e: e.lexeme)
    blocks = encode_dictionary(entries)
    assert [len(decode_dictionary_block(data)) for _, data in blocks] == _greedy_cut(entries)


@hsettings(max_examples=50)
@given(st.lists(st.tuples(st.integers(0, 299), st.integers(0, 40), st.integers(0, 3), st.integers(0, 9)),
                unique_by=lambda r: (r[0], r[1]), max_size=2000),
       st.integers(0, 299), st.integers(0, 300))
def test_a_segment_reads_back_one_lexeme_range(rows: list[tuple[int, int, int, int]], low: int,
                                              high: int) -> None:
    # 长词位让一个段有几十个词典块；并段按词位分片读：给了 [low, high) 只读回这一段词位的倒排，跨边界的块两边都读
    lexemes = [f"{t:03d}" + "词" * 40 for t in range(300)]
    postings = _postings(rows + [(t, 41, 0, 1) for t in range(300)])  # 每个词都在：词典有几十块
    segment = build_segment(lexemes, postings)
    assert len(segment.dictionary) > 1
    low_lexeme = lexemes[low]
    high_lexeme = lexemes[high] if high < len(lexemes) else None
    in_range = [(lexeme, data) for lexeme, _, data in segment.blocks
                if lexeme >= low_lexeme and (high_lexeme is None or lexeme < high_lexeme)]
    read_lexemes, read_postings = read_segment([data for _, data in reversed(segment.dictionary)], in_range,
                                               low=low_lexeme, high=high_lexeme, norms=_norms)
    assert read_lexemes == sorted(read_lexemes)
    expected = {row for row in _as_set(lexemes, postings)
                if row[0] >= low_lexeme and (high_lexeme is None or row[0] < high_lexeme)}
    assert _as_set(read_lexemes, read_postings) == expected


def test_read_segment_rejects_a_block_whose_lexeme_is_not_in_the_dictionary() -> None:
    segment = build_segment(["common"], _postings([(0, doc, 0, 1) for doc in range(300)]))
    with pytest.raises(ValueError, match="不在词典里"):
        read_segment([data for _, data in segment.dictionary], [("other", segment.blocks[0][2])])


def test_prefix_dfs_sum_by_first_character_and_need_sorted_lexemes() -> None:
    assert prefix_dfs(["a", "ab", "b", "肝", "肝功"], [1, 2, 3, 4, 5]) == [("a", 3), ("b", 3), ("肝", 9)]
    assert prefix_dfs([], []) == []
    with pytest.raises(ValueError, match="升序"):
        prefix_dfs(["b", "a"], [1, 1])
