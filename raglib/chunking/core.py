"""分块入口 ``chunk_text``：按 ``ChunkingOptions.strategy`` 分派到各算法，统一产出 ``ChunkDraft``。"""

from __future__ import annotations

import numpy as np

from raglib.chunking.markdown import MarkdownLayout
from raglib.chunking.options import ChunkDraft, ChunkingOptions, ChunkRole, EmbedFn
from raglib.chunking.paragraphs import paragraph_spans
from raglib.chunking.recursive import recursive_split
from raglib.chunking.semantic import adjacent_similarities, find_cliffs, merge_into_chunks
from raglib.chunking.sentences import sentence_spans
from raglib.chunking.token_chunker import TokenChunker
from raglib.chunking.tokenizer import Tokenizer

__all__ = ["chunk_text"]


def chunk_text(
    markdown: str,
    options: ChunkingOptions,
    *,
    tokenizer: Tokenizer,
    embed: EmbedFn | None = None,
) -> list[ChunkDraft]:
    """把 Markdown 切成 ``ChunkDraft`` 列表（文档顺序）。

    - 参数不合法抛 ``ValueError``（见 ``ChunkingOptions.validate``）；
    - ``semantic`` 策略必须提供 ``embed``，否则抛 ``ValueError``；它对全部句子只调用一次 ``embed``
      （句子不足两句时不调用）；
    - 空文本或全是空白返回 ``[]``；
    - 每个结果都满足 ``text == markdown[start:end]``，``heading_path`` 取 ``start`` 处的标题层级。
    """
    options.validate()
    if options.strategy == "semantic" and embed is None:
        raise ValueError("semantic chunking requires an embed function (embed=...)")
    if not markdown.strip():
        return []
    layout = MarkdownLayout.parse(markdown)
    if options.strategy == "token":
        return _token(markdown, layout, options, tokenizer)
    if options.strategy in ("recursive", "paragraph"):
        return _by_characters(markdown, layout, options, tokenizer)
    if options.strategy == "parent_child":
        return _parent_child(markdown, layout, options, tokenizer)
    assert embed is not None
    return _semantic(markdown, layout, options, tokenizer, embed)


def _draft(
    markdown: str,
    layout: MarkdownLayout,
    span: tuple[int, int],
    token_count: int,
    role: ChunkRole = "chunk",
    parent: int | None = None,
) -> ChunkDraft:
    start, end = span
    return ChunkDraft(
        text=markdown[start:end],
        start=start,
        end=end,
        heading_path=layout.heading_path_at(start),
        token_count=token_count,
        role=role,
        parent=parent,
    )


def _token(markdown: str, layout: MarkdownLayout, options: ChunkingOptions, tokenizer: Tokenizer) -> list[ChunkDraft]:
    chunker = TokenChunker(markdown, tokenizer, layout)
    pieces = chunker.chunk(0, len(markdown), options.chunk_size, options.overlap)
    return [_draft(markdown, layout, (p.start, p.end), p.token_count) for p in pieces]


def _by_characters(
    markdown: str, layout: MarkdownLayout, options: ChunkingOptions, tokenizer: Tokenizer
) -> list[ChunkDraft]:
    split = paragraph_spans if options.strategy == "paragraph" else recursive_split
    spans = split(markdown, options.chunk_size, options.overlap)
    counts = tokenizer.count_many([markdown[start:end] for start, end in spans])
    return [_draft(markdown, layout, span, count) for span, count in zip(spans, counts, strict=True)]


def _parent_child(
    markdown: str, layout: MarkdownLayout, options: ChunkingOptions, tokenizer: Tokenizer
) -> list[ChunkDraft]:
    """父块（≤ parent_size token，互不重叠）后面紧跟它的子块（≤ chunk_size token，带子块重叠）。"""
    chunker = TokenChunker(markdown, tokenizer, layout)
    drafts: list[ChunkDraft] = []
    for parent in chunker.chunk(0, len(markdown), options.parent_size, 0):
        parent_index = len(drafts)
        drafts.append(_draft(markdown, layout, (parent.start, parent.end), parent.token_count, "parent"))
        for child in chunker.chunk(parent.start, parent.end, options.chunk_size, options.overlap):
            drafts.append(
                _draft(markdown, layout, (child.start, child.end), child.token_count, "child", parent_index)
            )
    return drafts


def _semantic(
    markdown: str,
    layout: MarkdownLayout,
    options: ChunkingOptions,
    tokenizer: Tokenizer,
    embed: EmbedFn,
) -> list[ChunkDraft]:
    size = options.chunk_size
    spans = sentence_spans(markdown, layout)
    counts = tokenizer.count_many([markdown[start:end] for start, end in spans])
    # 单句就超过上限的（长表格行、没有标点的长段、代码块）先按 token 策略切小，再参与断崖检测
    units: list[tuple[int, int]] = []
    unit_counts: list[int] = []
    chunker: TokenChunker | None = None
    for span, count in zip(spans, counts, strict=True):
        if count <= size:
            units.append(span)
            unit_counts.append(count)
            continue
        chunker = chunker or TokenChunker(markdown, tokenizer, layout)
        for piece in chunker.chunk(span[0], span[1], size, 0):
            units.append((piece.start, piece.end))
            unit_counts.append(piece.token_count)

    cliffs: list[int] = []
    if len(units) >= 2:
        vectors = np.asarray(embed([markdown[start:end] for start, end in units]))
        if vectors.ndim != 2 or vectors.shape[0] != len(units):
            raise ValueError(f"embed returned an array of shape {vectors.shape} for {len(units)} sentences")
        cliffs = find_cliffs(adjacent_similarities(vectors), options.cliff_percentile)

    drafts: list[ChunkDraft] = []
    for first, stop in merge_into_chunks(unit_counts, cliffs, size, options.min_chunk_tokens):
        for span, count in _fit(markdown, units[first:stop], size, tokenizer):
            drafts.append(_draft(markdown, layout, span, count))
    return drafts


def _fit(
    markdown: str, units: list[tuple[int, int]], size: int, tokenizer: Tokenizer
) -> list[tuple[tuple[int, int], int]]:
    """核对合并后整块的真实 token 数；按句子 token 数之和估计偶尔会偏小，超了就再按句切开。"""
    span = (units[0][0], units[-1][1])
    count = tokenizer.count(markdown[span[0] : span[1]])
    if count <= size or len(units) == 1:
        return [(span, count)]
    result: list[tuple[tuple[int, int], int]] = []
    begin = 0
    while begin < len(units):
        stop = begin + 1
        best = tokenizer.count(markdown[units[begin][0] : units[begin][1]])
        while stop < len(units):
            trial = tokenizer.count(markdown[units[begin][0] : units[stop][1]])
            if trial > size:
                break
            best = trial
            stop += 1
        result.append(((units[begin][0], units[stop - 1][1]), best))
        begin = stop
    return result
