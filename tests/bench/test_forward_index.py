"""正排存法的基准（bench/forward_index.py）：每种正排都要原样还原 tsvector 里的词位与标题 / 正文词频，数字才作数。"""

from __future__ import annotations

from bench.forward_index import (
    column_forward,
    decode_column_forward,
    decode_id_forward,
    decode_text_forward,
    id_forward,
    parse_vector,
    text_forward,
)
from raglib.analysis import document_terms


def test_every_forward_encoding_round_trips_the_terms_of_a_tsvector():
    vector, _ = document_terms("肝功能检查 it's a test，肝功能正常。", ["体检报告.pdf", "肝功能"], analyzer="bigram")
    terms = parse_vector(vector)
    assert ("肝功", 1, 2) in terms  # 标题里一次（权重 A），正文里两次（B）
    assert ("pdf", 1, 0) in terms
    assert [t[0] for t in terms] == sorted((t[0] for t in terms), key=str.encode)
    assert decode_text_forward(text_forward(terms)) == {lexeme: (title, body) for lexeme, title, body in terms}
    for encoding in ("utf-8", "gb18030"):
        assert decode_column_forward(column_forward(terms, encoding), encoding) == \
            {lexeme: (title, body) for lexeme, title, body in terms}
    assert decode_column_forward(column_forward([], "gb18030"), "gb18030") == {}
    # 词号取词位在一个大词表里的下标：差分要跨过多字节的变长整数
    ids = [i * 997 for i in range(len(terms))]
    bodies = [t[2] for t in terms]
    bodies[0] = 300  # 正文词频一个字节，截到 255（BM25 的饱和项早已平了）
    decoded = decode_id_forward(id_forward(ids, [t[1] for t in terms], bodies))
    assert decoded == (ids, [t[1] for t in terms], [min(body, 255) for body in bodies])
