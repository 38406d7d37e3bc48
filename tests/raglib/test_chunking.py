"""分块算法测试：hypothesis 属性测试 + 中文示例。不访问数据库。

对应 docs/INVARIANTS.md 中与分块有关的保证：QUOTE-INTACT、ADJACENT-SIM-COUNT、CLIFF-THRESHOLD、
CHUNK-SIZE-LIMIT、CHUNK-COVERAGE、RECURSIVE-SPLIT、PARENT-CHILD-LINKAGE。
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from raglib.chunking import (
    ChunkDraft,
    ChunkingOptions,
    MarkdownLayout,
    Tokenizer,
    TokenizerLoadError,
    adjacent_similarities,
    chunk_text,
    cliff_threshold,
    find_cliffs,
    heading_path_at,
    merge_into_chunks,
    recursive_split,
    sentence_spans,
    split_sentences,
)
from raglib.chunking._text import is_char_boundary
from raglib.chunking.tokenizer import bundled_tokenizer_path

TK = Tokenizer.load()

# 属性测试统一设置：不设单例耗时上限（首个样例要编码 tokenizer 缓存），样例数按耗时分档
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MEDIUM = settings(max_examples=35, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------
# 生成器：以中文为主的 Markdown
# ---------------------------------------------------------------------------

HAN = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方"
HAN += "后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好"
HAN += "招标投标人应当具备承担项目能力资格条件文件澄清修改截止时间开评审委员会报价货物工程服务合同履约保证金"
ENGLISH_WORDS = ["ISO", "9001", "GB/T", "PDF", "BGE-M3", "OK", "v2"]
SENTENCE_ENDS = ["。", "。", "。", "！", "？", "；", "…", "!", "?"]
CLAUSES = ["，", "、", ", "]

han = st.text(alphabet=HAN, min_size=1, max_size=12)


@st.composite
def sentences(draw: st.DrawFn) -> str:
    parts = [draw(han)]
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["clause", "english", "han", "quote"]))
        if kind == "clause":
            parts.append(draw(st.sampled_from(CLAUSES)) + draw(han))
        elif kind == "english":
            parts.append(" " + draw(st.sampled_from(ENGLISH_WORDS)) + " " + draw(han))
        elif kind == "quote":
            parts.append("“" + draw(han) + "。" + draw(han) + "！”" + draw(han))
        else:
            parts.append(draw(han))
    return "".join(parts) + draw(st.sampled_from(SENTENCE_ENDS))


@dataclass
class GeneratedDoc:
    """生成的 Markdown 及其"真值"：每个标题生效的位置与路径、表格行区间、引号区间。"""

    markdown: str
    heading_events: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    table_rows: list[tuple[int, int]] = field(default_factory=list)

    def expected_path(self, pos: int) -> tuple[str, ...]:
        index = bisect_right([p for p, _ in self.heading_events], pos) - 1
        return self.heading_events[index][1] if index >= 0 else ()


@st.composite
def markdown_docs(draw: st.DrawFn, max_blocks: int = 10) -> GeneratedDoc:
    """随机的中文 Markdown：ATX/Setext 标题、段落（含软换行）、表格、列表、含 ``#`` 行的代码块。"""
    doc = GeneratedDoc("")
    out: list[str] = []
    pos = 0
    stack: list[tuple[int, str]] = []

    def emit(text: str) -> int:
        nonlocal pos
        start = pos
        out.append(text)
        pos += len(text)
        return start

    blocks = draw(st.lists(st.sampled_from(["heading", "para", "para", "para", "table", "list", "code"]),
                           min_size=1, max_size=max_blocks))
    for index, block in enumerate(blocks):
        if index:
            emit("\n\n")
        if block == "heading":
            level = draw(st.integers(1, 4))
            title = draw(han) + draw(st.sampled_from(["", " 总则", " 1.2 目的", " Scope"]))
            setext = level <= 2 and draw(st.booleans())
            indent = "" if setext else " " * draw(st.integers(0, 3))
            start = emit(indent) + len(indent)
            if setext:
                emit(title + "\n" + ("=" if level == 1 else "-") * draw(st.integers(1, 5)))
            else:
                emit("#" * level + " " + title + draw(st.sampled_from(["", " #", " ##"])))
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
            doc.heading_events.append((start, tuple(t for _, t in stack)))
            if not setext and draw(st.booleans()):
                emit("\n" + draw(sentences()))  # ATX 标题后直接跟正文
        elif block == "para":
            body = draw(st.lists(sentences(), min_size=1, max_size=8))
            joiners = draw(st.lists(st.sampled_from(["", "", " ", "\n"]), min_size=len(body), max_size=len(body)))
            emit("".join(s + j for s, j in zip(body, joiners, strict=True)).rstrip())
        elif block == "table":
            cols = draw(st.integers(2, 3))
            emit("| " + " | ".join(draw(han) for _ in range(cols)) + " |\n")
            emit("|" + "---|" * cols)
            for _ in range(draw(st.integers(1, 4))):
                emit("\n")
                row = "| " + " | ".join(draw(sentences()) for _ in range(cols)) + " |"
                start = emit(row)
                doc.table_rows.append((start, start + len(row)))
        elif block == "list":
            items = draw(st.lists(sentences(), min_size=1, max_size=4))
            emit("\n".join("- " + item for item in items))
        else:
            emit("```python\n# 不是标题\n" + draw(sentences()) + "\n## 也不是\n```")
    doc.markdown = "".join(out)
    return doc


def topic_embed(dim: int = 64) -> Callable[[list[str]], np.ndarray]:
    """确定性的假 embedding：按文本哈希得到单位向量（相同文本相同向量）。"""

    def embed(texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
            rows.append(np.random.default_rng(seed).standard_normal(dim))
        matrix = np.array(rows, dtype=np.float64).reshape(len(texts), dim)
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)

    return embed


hash_embed = topic_embed()

# ---------------------------------------------------------------------------
# 通用断言
# ---------------------------------------------------------------------------


def assert_exact_offsets(markdown: str, drafts: list[ChunkDraft]) -> None:
    for draft in drafts:
        assert draft.text == markdown[draft.start : draft.end]
        assert draft.text and draft.text == draft.text.strip()


def assert_covered(markdown: str, drafts: list[ChunkDraft]) -> None:
    """每个非空白字符至少落在一个块里。"""
    marks = np.zeros(len(markdown) + 1, dtype=np.int64)
    for draft in drafts:
        marks[draft.start] += 1
        marks[draft.end] -= 1
    covered = np.cumsum(marks)[: len(markdown)] > 0
    missing = [i for i, char in enumerate(markdown) if not char.isspace() and not covered[i]]
    assert not missing, f"uncovered characters at {missing[:5]}: {[markdown[i] for i in missing[:5]]}"


def assert_token_counts(drafts: list[ChunkDraft], limit: int) -> None:
    for draft in drafts:
        assert draft.token_count == TK.count(draft.text)
        assert draft.token_count <= limit, (draft.token_count, limit, draft.text)


def overlaps(size: int) -> st.SearchStrategy[int]:
    """重叠取 0 或 [2, size/2)：以汉字开头的片段单独编码至少 2 个 token（"▁" + 字），
    overlap=1 时放不下任何中文尾巴，"重叠 > 0" 的保证从 2 开始。"""
    return st.one_of(st.just(0), st.integers(2, size // 2 - 1))


def assert_overlap(markdown: str, drafts: list[ChunkDraft], overlap: int, headings: set[int] | None = None) -> None:
    """重叠属性（定义见 token_chunker 模块说明）。``headings`` 缺省时从 ``markdown`` 本身解析；父块里的子块要传整篇
    文档的标题位置（换算到父块内）：父块可能从一个代码块的结束围栏开始，单独解析会把后面的标题当成代码。"""
    if headings is None:
        headings = set(MarkdownLayout.parse(markdown).heading_positions)
    for prev, nxt in pairwise(drafts):
        assert nxt.start > prev.start and nxt.end > prev.end
        if nxt.start < prev.end:
            assert TK.count(markdown[nxt.start : prev.end]) <= overlap
        else:
            assert not markdown[prev.end : nxt.start].strip()
            if overlap > 0 and prev.token_count > overlap:
                assert nxt.start in headings, "no overlap although the boundary is not a heading"


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def test_tokenizer_count_matches_xlmr() -> None:
    raw = tokenizers.Tokenizer.from_file(str(bundled_tokenizer_path()))
    text = "北京是中国的首都"
    with_special = raw.encode(text)
    assert with_special.tokens[0] == "<s>" and with_special.tokens[-1] == "</s>"
    assert TK.count(text) == len(with_special.ids) - 2 == len(raw.encode(text, add_special_tokens=False).ids)
    assert TK.count(text) == 5  # ▁ / 北京 / 是中国 / 的 / 首都
    assert len(TK.offsets(text)) == TK.count(text)
    assert TK.count("") == 0 and TK.offsets("") == []
    assert TK.count_many(["北京", "", "首都"]) == [TK.count("北京"), 0, TK.count("首都")]


def test_tokenizer_is_cached_per_source(tmp_path: Path) -> None:
    assert Tokenizer.load() is TK
    source = bundled_tokenizer_path()
    (tmp_path / "tokenizer.json").symlink_to(source)
    from_dir = Tokenizer.load(str(tmp_path))
    assert from_dir.count("北京是中国的首都") == TK.count("北京是中国的首都")
    assert Tokenizer.load(str(tmp_path)) is from_dir
    assert Tokenizer.load(str(source)) is TK  # 文件路径与默认值解析到同一个缓存键


def test_tokenizer_load_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TokenizerLoadError, match=r"没有 tokenizer\.json"):
        Tokenizer.load(str(tmp_path))
    with pytest.raises(TokenizerLoadError, match="路径不存在"):
        Tokenizer.load(str(tmp_path / "missing" / "tokenizer.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a tokenizer"}))
    with pytest.raises(TokenizerLoadError, match="无法解析"):
        Tokenizer.load(str(bad))

    def offline(model_id: str) -> tokenizers.Tokenizer:
        raise RuntimeError("network is unreachable")

    monkeypatch.setattr(tokenizers.Tokenizer, "from_pretrained", offline)
    with pytest.raises(TokenizerLoadError, match="Hugging Face Hub"):
        Tokenizer.load("BAAI/bge-m3-offline-test")


# ---------------------------------------------------------------------------
# ChunkingOptions
# ---------------------------------------------------------------------------


def test_options_defaults_per_strategy() -> None:
    assert ChunkingOptions() == ChunkingOptions.for_strategy("token")
    token = ChunkingOptions()
    assert (token.strategy, token.chunk_size, token.overlap) == ("token", 512, 64)
    semantic = ChunkingOptions.for_strategy("semantic")
    assert (semantic.chunk_size, semantic.overlap, semantic.cliff_percentile) == (512, 0, 20.0)
    recursive = ChunkingOptions(strategy="recursive")
    assert (recursive.chunk_size, recursive.overlap) == (1000, 200)
    pc = ChunkingOptions.for_strategy("parent_child")
    assert (pc.chunk_size, pc.overlap, pc.parent_size) == (256, 32, 1024)
    assert ChunkingOptions.for_strategy("recursive", chunk_size=500).overlap == 200
    for options in (token, semantic, recursive, pc):
        options.validate()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"chunk_size": 0}, "chunk_size must be > 0"),
        ({"overlap": -1}, "overlap must satisfy"),
        ({"chunk_size": 64, "overlap": 64}, "overlap must satisfy"),
        ({"cliff_percentile": 101.0}, "cliff_percentile"),
        ({"min_chunk_tokens": -1}, "min_chunk_tokens"),
        ({"chunk_size": "512"}, "must be an integer"),
    ],
)
def test_options_validate_rejects(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ChunkingOptions.for_strategy("token", **overrides).validate()


def test_options_parent_child_and_unknown() -> None:
    with pytest.raises(ValueError, match="parent_size"):
        ChunkingOptions.for_strategy("parent_child", chunk_size=512, parent_size=256).validate()
    with pytest.raises(ValueError, match="unknown chunking strategy"):
        ChunkingOptions.for_strategy("magic")
    with pytest.raises(ValueError, match="unknown chunking strategy"):
        ChunkingOptions(strategy="magic").validate()  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ChunkingOptions.for_strategy("token", size=3)


def test_empty_input_and_semantic_requires_embed() -> None:
    for strategy in ("token", "recursive", "parent_child"):
        assert chunk_text("", ChunkingOptions.for_strategy(strategy), tokenizer=TK) == []
        assert chunk_text(" \n\t\u3000 ", ChunkingOptions.for_strategy(strategy), tokenizer=TK) == []
    assert chunk_text("  ", ChunkingOptions.for_strategy("semantic"), tokenizer=TK, embed=hash_embed) == []
    with pytest.raises(ValueError, match="embed"):
        chunk_text("正文。", ChunkingOptions.for_strategy("semantic"), tokenizer=TK)
    with pytest.raises(ValueError, match="overlap"):
        chunk_text("正文。", ChunkingOptions(chunk_size=10, overlap=10), tokenizer=TK)


# ---------------------------------------------------------------------------
# token 策略：上限、覆盖、偏移、重叠、标题路径
# ---------------------------------------------------------------------------


@FAST
@given(doc=markdown_docs(), size=st.integers(16, 160), data=st.data())
def test_token_strategy_properties(doc: GeneratedDoc, size: int, data: st.DataObject) -> None:
    overlap = data.draw(overlaps(size))
    markdown = doc.markdown
    drafts = chunk_text(markdown, ChunkingOptions(chunk_size=size, overlap=overlap), tokenizer=TK)
    assert drafts
    assert_token_counts(drafts, size)
    assert_exact_offsets(markdown, drafts)
    assert_covered(markdown, drafts)
    assert_overlap(markdown, drafts, overlap)
    for draft in drafts:
        assert draft.role == "chunk" and draft.parent is None
        assert draft.heading_path == doc.expected_path(draft.start)


@FAST
@given(text=st.text(min_size=1, max_size=400), size=st.integers(24, 96), overlap=st.integers(0, 11))
def test_token_strategy_arbitrary_unicode(text: str, size: int, overlap: int) -> None:
    """任意 Unicode（组合字符、emoji、\\r、全角空格……）下上限、覆盖、偏移仍成立。"""
    drafts = chunk_text(text, ChunkingOptions(chunk_size=size, overlap=overlap), tokenizer=TK)
    if not text.strip():
        assert drafts == []
        return
    assert_token_counts(drafts, size)
    assert_exact_offsets(text, drafts)
    assert_covered(text, drafts)
    for prev, nxt in pairwise(drafts):
        assert nxt.start > prev.start and nxt.end > prev.end
        if nxt.start < prev.end:
            assert TK.count(text[nxt.start : prev.end]) <= overlap


@FAST
@given(
    unit=st.sampled_from(["招标", "e\u0301", "👨\u200d👩\u200d👧", "❤\ufe0f", "🇨🇳", "Ab"]),
    repeat=st.integers(20, 120),
    size=st.integers(8, 40),
)
def test_long_sentence_split_at_token_boundaries(unit: str, repeat: int, size: int) -> None:
    """没有任何标点的超长"句子"只能按 token 切：不超限，且不切开组合字符/ZWJ 序列。"""
    text = unit * repeat
    drafts = chunk_text(text, ChunkingOptions(chunk_size=size, overlap=size // 4), tokenizer=TK)
    assert len(drafts) > 1 or TK.count(text) <= size
    assert_token_counts(drafts, size)
    assert_covered(text, drafts)
    for draft in drafts:
        assert is_char_boundary(text, draft.start) and is_char_boundary(text, draft.end)


def test_token_strategy_prefers_sentence_ends() -> None:
    """示例：招标文件节选，句子都短于上限时块尽量在句末（。；！？）结束。"""
    markdown = BID_EXCERPT
    drafts = chunk_text(markdown, ChunkingOptions(chunk_size=96, overlap=24), tokenizer=TK)
    assert len(drafts) >= 4
    layout = MarkdownLayout.parse(markdown)
    for draft in drafts[:-1]:
        following = markdown[draft.end :].lstrip()
        at_structure = markdown[draft.end : draft.end + 1] == "\n" or following.startswith(("#", "|"))
        assert draft.text[-1] in "。；！？" or at_structure, draft.text
        # 标题不会孤零零地挂在块末尾
        last_line = draft.text.rsplit("\n", 1)[-1]
        assert not last_line.startswith("#"), draft.text
    # 表格行不被切开：块的终点不落在表格行内部
    rows = [(line.lead, line.end) for line in layout.lines if line.kind.value.startswith("table")]
    for draft in drafts:
        assert not any(lead < draft.end < end for lead, end in rows)
    # 不在标题处换块时有重叠，且重叠尽量取整句/整子句（前一块的最后一两句）
    overlapped = [(p, n) for p, n in pairwise(drafts) if n.start not in layout.heading_positions]
    assert overlapped
    for prev, nxt in overlapped:
        assert nxt.start < prev.end
        assert markdown[nxt.start - 1] in "。；！？，、\n", nxt.text


def test_token_chunks_do_not_overlap_across_headings() -> None:
    markdown = "# 第一章\n\n" + "投标人应当按要求提交文件。" * 8 + "\n\n# 第二章\n\n" + "评标委员会依法组建。" * 8
    drafts = chunk_text(markdown, ChunkingOptions(chunk_size=64, overlap=16), tokenizer=TK)
    second_heading = markdown.index("# 第二章")
    starting_there = [d for d in drafts if d.start == second_heading]
    assert starting_there and starting_there[0].heading_path == ("第二章",)
    for draft in drafts:
        if draft.start >= second_heading:
            assert draft.heading_path == ("第二章",)
        else:
            assert draft.heading_path == ("第一章",)
            assert draft.end <= second_heading


# ---------------------------------------------------------------------------
# 标题层级
# ---------------------------------------------------------------------------


def test_heading_paths_atx_setext_and_code_fences() -> None:
    markdown = (
        "前言文字。\n\n"
        "# 第一章 总则 #\n\n"
        "## 1.1 目的\n正文一。\n\n"
        "```\n# 代码里的注释\n```\n\n"
        "~~~~\n## 也不是标题\n~~~\n~~~~\n\n"
        "第二章 投标\n======\n\n"
        "2.1 资格\n---\n\n"
        "#### 2.1.1 细则\n\n"
        "#没有空格不是标题\n\n"
        "## 2.2 文件\n内容。"
    )
    def at(needle: str) -> tuple[str, ...]:
        return heading_path_at(markdown, markdown.index(needle))

    assert at("前言") == ()
    assert at("# 第一章") == ("第一章 总则",)
    assert at("正文一") == ("第一章 总则", "1.1 目的")
    assert at("代码里的注释") == ("第一章 总则", "1.1 目的")
    assert at("也不是标题") == ("第一章 总则", "1.1 目的")
    assert at("第二章 投标") == ("第二章 投标",)
    assert at("2.1 资格") == ("第二章 投标", "2.1 资格")
    assert at("2.1.1 细则") == ("第二章 投标", "2.1 资格", "2.1.1 细则")
    assert at("没有空格") == ("第二章 投标", "2.1 资格", "2.1.1 细则")
    assert at("内容") == ("第二章 投标", "2.2 文件")


@MEDIUM
@given(doc=markdown_docs(), strategy=st.sampled_from(["token", "recursive", "parent_child", "semantic"]))
def test_heading_path_all_strategies(doc: GeneratedDoc, strategy: str) -> None:
    small = {"token": {"chunk_size": 48, "overlap": 8}, "recursive": {"chunk_size": 80, "overlap": 20},
             "parent_child": {"chunk_size": 32, "overlap": 4, "parent_size": 96}, "semantic": {"chunk_size": 48}}
    options = ChunkingOptions.for_strategy(strategy, **small[strategy])
    drafts = chunk_text(doc.markdown, options, tokenizer=TK, embed=hash_embed)
    assert drafts
    for draft in drafts:
        assert draft.heading_path == doc.expected_path(draft.start)


# ---------------------------------------------------------------------------
# 句子切分（QUOTE-INTACT）
# ---------------------------------------------------------------------------

QUOTE_PAIRS = [("“", "”"), ("「", "」"), ("『", "』"), ("\u2018", "\u2019"), ('"', '"'), ("'", "'")]


@st.composite
def quoted_texts(draw: st.DrawFn) -> tuple[str, list[tuple[int, int]]]:
    """中文句子间插入带句末标点的引文；返回文本与每段引文（含引号）的区间。"""
    out = ""
    quotes = []
    for _ in range(draw(st.integers(1, 6))):
        out += draw(sentences())
        if draw(st.booleans()):
            out += draw(st.sampled_from(["\n\n", "\n", " "]))
        if draw(st.booleans()):
            opening, closing = draw(st.sampled_from(QUOTE_PAIRS))
            inner = draw(han) + draw(st.sampled_from(SENTENCE_ENDS)) + draw(st.sampled_from(["", " "])) + draw(han)
            inner += draw(st.sampled_from(["。", "！", "？", "…", ""]))
            out += draw(han) + draw(st.sampled_from(["：", "说", " "]))
            quotes.append((len(out), len(out) + len(opening + inner + closing)))
            out += opening + inner + closing + draw(st.sampled_from(["", "然后离开了。", "。"]))
    return out, quotes


@FAST
@given(case=quoted_texts())
def test_sentence_split_keeps_quotes_whole(case: tuple[str, list[tuple[int, int]]]) -> None:
    """引文（含其中的句末标点）整体落在同一个句子里（见 docs/INVARIANTS.md 的 QUOTE-INTACT）。"""
    text, quotes = case
    spans = sentence_spans(text)
    for start, end in quotes:
        assert any(s <= start and end <= e for s, e in spans), (text[start:end], [text[s:e] for s, e in spans])
    # 句子互不重叠、按序、去掉首尾空白，且覆盖所有非空白字符
    for (s1, e1), (s2, _) in pairwise(spans):
        assert e1 <= s2
    assert "".join("".join(text[s:e] for s, e in spans).split()) == "".join(text.split())


def test_split_sentences_examples() -> None:
    assert split_sentences("他说：“今天下雨。我们不去了！”然后离开了。这是第二句。") == [
        "他说：“今天下雨。我们不去了！”然后离开了。",
        "这是第二句。",
    ]
    assert split_sentences("「第一。」她答道。『第二！』") == ["「第一。」她答道。", "『第二！』"]
    assert split_sentences("Version 3.14 is out. It's great! Don't 'panic. Really.' OK") == [
        "Version 3.14 is out.",
        "It's great!",
        "Don't 'panic. Really.' OK",
    ]
    # 未闭合的引号只影响到行尾
    assert split_sentences("他说：“没有闭合。还在引号里。\n新的一行。第二句。") == [
        "他说：“没有闭合。还在引号里。\n新的一行。",
        "第二句。",
    ]
    # 表格行、标题各自成句，表格行内的句号不切
    assert split_sentences("# 标题\n| 甲。乙 | 丙 |\n|---|---|\n| 1。2 | 3 |\n正文。") == [
        "# 标题",
        "| 甲。乙 | 丙 |\n|---|---|",
        "| 1。2 | 3 |",
        "正文。",
    ]
    assert split_sentences("硬换行的\n段落。下一句") == ["硬换行的\n段落。", "下一句"]


def test_common_abbreviations_do_not_end_a_sentence() -> None:
    """论文与百科里常见的缩写后面的点不是句末（不分大小写）；etc. 这类常在句末的缩写、词尾恰好是缩写的词照样断。"""
    text = ("Agents (e.g. GPT-4) help. Smith et al. (2020) showed it, see Fig. 3 and EQ. 2. "
            "Dr. Who met Mr. X in St. Louis. It was the first. We list tables etc. Then stop. It took 12 ms. Done.")
    assert split_sentences(text) == [
        "Agents (e.g. GPT-4) help.",
        "Smith et al. (2020) showed it, see Fig. 3 and EQ. 2.",
        "Dr. Who met Mr. X in St. Louis.",
        "It was the first.",
        "We list tables etc.",
        "Then stop.",
        "It took 12 ms.",
        "Done.",
    ]


# ---------------------------------------------------------------------------
# 相似度与断崖（ADJACENT-SIM-COUNT、CLIFF-THRESHOLD）
# ---------------------------------------------------------------------------


@FAST
@given(
    vectors=st.integers(0, 12).flatmap(
        lambda n: st.integers(1, 6).flatmap(
            lambda d: hnp.arrays(np.float64, (n, d), elements=st.floats(-10, 10, allow_nan=False))
        )
    )
)
def test_adjacent_similarity_count(vectors: np.ndarray) -> None:
    """n 个句子恰好得到 n-1 个相似度（见 docs/INVARIANTS.md 的 ADJACENT-SIM-COUNT）。"""
    sims = adjacent_similarities(vectors)
    n = vectors.shape[0]
    assert sims.shape == (max(n - 1, 0),)
    assert np.all((sims >= -1.0) & (sims <= 1.0))
    for i in range(n - 1):
        a, b = (v / np.abs(v).max() if np.abs(v).max() > 0 else v for v in (vectors[i], vectors[i + 1]))
        norms = np.linalg.norm(a) * np.linalg.norm(b)
        expected = 0.0 if norms == 0 else float(np.clip(a @ b / norms, -1, 1))
        assert sims[i] == pytest.approx(expected, abs=1e-9)


def reference_percentile(values: list[float], percentile: float) -> float:
    """线性插值百分位的参考实现：秩 r = p/100·(m-1)，在相邻两个次序统计量之间线性插值。"""
    ordered = sorted(values)
    rank = percentile / 100 * (len(ordered) - 1)
    low = int(np.floor(rank))
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


@FAST
@given(
    sims=st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=40),
    percentile=st.floats(0, 100, allow_nan=False),
)
def test_cliff_threshold_partition(sims: list[float], percentile: float) -> None:
    """断崖处相似度 ≤ 百分位阈值，非断崖处 > 阈值（见 docs/INVARIANTS.md 的 CLIFF-THRESHOLD）。"""
    threshold = cliff_threshold(sims, percentile)
    assert threshold == pytest.approx(reference_percentile(sims, percentile), abs=1e-12)
    cliffs = set(find_cliffs(sims, percentile))
    assert cliffs  # 阈值不小于最小值，至少一个断崖
    for index, value in enumerate(sims):
        if index in cliffs:
            assert value <= threshold
        else:
            assert value > threshold
    default = set(find_cliffs(sims))
    assert all(sims[i] <= cliff_threshold(sims, 20.0) for i in default)


def test_cliff_examples() -> None:
    assert find_cliffs([]) == []
    sims = [0.9, 0.2, 0.8, 0.85, 0.1, 0.95]
    # 升序 0.1 0.2 0.8 0.85 0.9 0.95，秩 0.2*5=1 → 阈值 0.2
    assert cliff_threshold(sims) == pytest.approx(0.2)
    assert find_cliffs(sims) == [1, 4]
    assert find_cliffs([0.5, 0.5, 0.5]) == [0, 1, 2]  # 全相等时都 ≤ 阈值


# ---------------------------------------------------------------------------
# 合并与强制切分（CHUNK-SIZE-LIMIT）
# ---------------------------------------------------------------------------


@FAST
@given(
    counts=st.lists(st.integers(1, 120), min_size=0, max_size=40),
    max_tokens=st.integers(1, 300),
    data=st.data(),
)
def test_merge_into_chunks_properties(counts: list[int], max_tokens: int, data: st.DataObject) -> None:
    """合并后每块不超上限；断崖处必切；其余切分都是被上限逼出来的（见 docs/INVARIANTS.md 的 CHUNK-SIZE-LIMIT）。"""
    n = len(counts)
    cliffs = data.draw(st.sets(st.integers(0, max(n - 2, 0)), max_size=n)) if n > 1 else set()
    groups = merge_into_chunks(counts, cliffs, max_tokens)
    assert [i for g in groups for i in range(*g)] == list(range(n))
    boundaries = {end - 1 for _, end in groups[:-1]}  # 在第 i 句之后切开
    assert cliffs <= boundaries
    for index, (start, end) in enumerate(groups):
        total = sum(counts[start:end])
        assert total <= max_tokens or end - start == 1
        if index + 1 < len(groups) and end - 1 not in cliffs:
            assert total + counts[end] > max_tokens  # 强制切分：下一句放不下


@FAST
@given(
    counts=st.lists(st.integers(1, 60), min_size=1, max_size=30),
    max_tokens=st.integers(60, 200),
    min_tokens=st.integers(1, 60),
    data=st.data(),
)
def test_merge_small_chunks(counts: list[int], max_tokens: int, min_tokens: int, data: st.DataObject) -> None:
    cliffs = set(range(len(counts) - 1))  # 每句都是断崖时，小块合并最明显
    groups = merge_into_chunks(counts, cliffs, max_tokens, min_tokens=min_tokens)
    assert [i for g in groups for i in range(*g)] == list(range(len(counts)))
    sums = [sum(counts[s:e]) for s, e in groups]
    assert all(total <= max_tokens for total in sums)
    for index, total in enumerate(sums):
        if total < min_tokens and len(sums) > 1:
            # 仍然偏小的块：与相邻块合并都会超上限
            neighbours = [sums[j] for j in (index - 1, index + 1) if 0 <= j < len(sums)]
            assert all(total + other > max_tokens for other in neighbours)


# ---------------------------------------------------------------------------
# semantic 策略
# ---------------------------------------------------------------------------

TOPIC_CHARS = "甲乙丙丁戊己庚辛壬癸"
PLAIN = "".join(c for c in HAN if c not in TOPIC_CHARS)


def one_hot_topic_embed(texts: list[str]) -> np.ndarray:
    """按句首的主题字给出正交向量：同主题相似度 1，不同主题 0。"""
    matrix = np.zeros((len(texts), len(TOPIC_CHARS)))
    for row, text in enumerate(texts):
        matrix[row, TOPIC_CHARS.index(text[0])] = 1.0
    return matrix


@FAST
@given(data=st.data())
def test_semantic_splits_exactly_at_topic_changes(data: st.DataObject) -> None:
    """主题切换处相似度为 0、其余为 1；主题切换占相邻位置 > 20% 时，断崖恰好是主题切换处。"""
    topics = data.draw(st.lists(st.integers(0, len(TOPIC_CHARS) - 1), min_size=2, max_size=8))
    topics = [t for i, t in enumerate(topics) if i == 0 or t != topics[i - 1]]
    runs = []
    for topic in topics:
        count = data.draw(st.integers(1, 3))
        body = data.draw(st.lists(st.text(alphabet=PLAIN, min_size=2, max_size=10), min_size=count, max_size=count))
        runs.append([TOPIC_CHARS[topic] + sentence + "。" for sentence in body])
    joiner = data.draw(st.sampled_from(["", "\n\n"]))
    markdown = joiner.join("".join(run) for run in runs)
    calls: list[int] = []

    def embed(texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        return one_hot_topic_embed(texts)

    drafts = chunk_text(markdown, ChunkingOptions.for_strategy("semantic"), tokenizer=TK, embed=embed)
    n_sentences = sum(len(run) for run in runs)
    changes = len(runs) - 1
    assert calls == ([n_sentences] if n_sentences > 1 else [])
    if changes == 0:
        # 全部相似度相等（=1）→ 全部位置都是断崖 → 每句一块
        assert len(drafts) == n_sentences
    else:
        assert changes > 0.2 * (n_sentences - 2)
        assert [d.text for d in drafts] == ["".join(run) for run in runs]


@MEDIUM
@given(doc=markdown_docs(), size=st.integers(12, 120), percentile=st.floats(0, 100))
def test_semantic_strategy_properties(doc: GeneratedDoc, size: int, percentile: float) -> None:
    """语义块不超过 token 上限（超长句被强制切开），并覆盖全文（见 docs/INVARIANTS.md 的 CHUNK-SIZE-LIMIT、
    CHUNK-COVERAGE）。"""
    markdown = doc.markdown
    options = ChunkingOptions.for_strategy("semantic", chunk_size=size, cliff_percentile=percentile)
    drafts = chunk_text(markdown, options, tokenizer=TK, embed=hash_embed)
    assert_token_counts(drafts, size)
    assert_exact_offsets(markdown, drafts)
    assert_covered(markdown, drafts)
    for prev, nxt in pairwise(drafts):
        assert prev.end <= nxt.start  # 语义块互不重叠


def test_semantic_forced_split_of_long_sentences() -> None:
    """超过上限时无视语义边界强制切分（含没有标点的超长句；见 docs/INVARIANTS.md 的 CHUNK-SIZE-LIMIT）。"""
    markdown = "甲" + "招标文件规定投标人应当具备相应资质" * 20 + "。乙短句。"
    drafts = chunk_text(markdown, ChunkingOptions.for_strategy("semantic", chunk_size=32), tokenizer=TK,
                        embed=one_hot_topic_embed_safe)
    assert len(drafts) > 3
    assert_token_counts(drafts, 32)
    assert_covered(markdown, drafts)
    assert drafts[-1].text == "乙短句。"


def one_hot_topic_embed_safe(texts: list[str]) -> np.ndarray:
    """句首不是主题字的片段归入第 0 个主题。"""
    return one_hot_topic_embed([t if t[0] in TOPIC_CHARS else TOPIC_CHARS[0] + t for t in texts])


def test_semantic_rejects_bad_embed_shape() -> None:
    with pytest.raises(ValueError, match="shape"):
        chunk_text("第一句。第二句。", ChunkingOptions.for_strategy("semantic"), tokenizer=TK,
                   embed=lambda texts: np.zeros((1, 4)))


def test_semantic_min_chunk_tokens_merges_small_chunks() -> None:
    markdown = "甲一。乙二。丙三。丁四。"
    options = ChunkingOptions.for_strategy("semantic", chunk_size=64, min_chunk_tokens=20)
    drafts = chunk_text(markdown, options, tokenizer=TK, embed=one_hot_topic_embed)
    assert [d.text for d in drafts] == [markdown]


# ---------------------------------------------------------------------------
# recursive 策略
# ---------------------------------------------------------------------------


@FAST
@given(
    text=st.one_of(markdown_docs().map(lambda d: d.markdown), st.text(max_size=600)),
    size=st.integers(10, 300),
    data=st.data(),
)
def test_recursive_strategy_properties(text: str, size: int, data: st.DataObject) -> None:
    overlap = data.draw(st.integers(0, size - 1))
    drafts = chunk_text(text, ChunkingOptions.for_strategy("recursive", chunk_size=size, overlap=overlap),
                        tokenizer=TK)
    if not text.strip():
        assert drafts == []
        return
    assert_exact_offsets(text, drafts)
    assert_covered(text, drafts)
    for draft in drafts:
        assert len(draft.text) <= size
        assert draft.token_count == TK.count(draft.text)
    for prev, nxt in pairwise(drafts):
        assert nxt.start >= prev.start and nxt.end > prev.end
        assert max(0, prev.end - nxt.start) <= overlap
    if len(text.strip()) <= size:
        assert [d.text for d in drafts] == [text.strip()]  # 不超过上限的内容不分块（RECURSIVE-SPLIT）


def test_recursive_prefers_paragraphs_then_sentences() -> None:
    paragraph = "投标人应当按照招标文件的要求编制投标文件。投标文件应当对招标文件提出的实质性要求和条件作出响应。"
    text = "\n\n".join([paragraph] * 3)
    spans = recursive_split(text, 40, 0)
    assert [text[s:e] for s, e in spans] == [
        "投标人应当按照招标文件的要求编制投标文件。",
        "投标文件应当对招标文件提出的实质性要求和条件作出响应。",
    ] * 3
    spans = recursive_split(text, len(paragraph) + 3, 0)
    assert [text[s:e] for s, e in spans] == [paragraph] * 3
    with_overlap = recursive_split(text, 110, 60)
    assert len(with_overlap) > 1
    assert all(e - s <= 110 for s, e in with_overlap)


# ---------------------------------------------------------------------------
# parent_child 策略
# ---------------------------------------------------------------------------


@MEDIUM
@given(doc=markdown_docs(max_blocks=14), parent=st.integers(48, 200), data=st.data())
def test_parent_child_linkage(doc: GeneratedDoc, parent: int, data: st.DataObject) -> None:
    child = data.draw(st.integers(16, parent))
    overlap = data.draw(overlaps(child))
    markdown = doc.markdown
    options = ChunkingOptions.for_strategy("parent_child", chunk_size=child, overlap=overlap, parent_size=parent)
    drafts = chunk_text(markdown, options, tokenizer=TK)
    parents = [d for d in drafts if d.role == "parent"]
    assert parents and {d.role for d in drafts} <= {"parent", "child"}
    assert_token_counts(parents, parent)
    assert_exact_offsets(markdown, drafts)
    assert_covered(markdown, parents)
    headings = MarkdownLayout.parse(markdown).heading_positions
    for prev, nxt in pairwise(parents):
        assert prev.end <= nxt.start  # 父块互不重叠
    for index, draft in enumerate(drafts):
        if draft.role == "parent":
            assert draft.parent is None
            continue
        assert draft.parent is not None and draft.parent < index
        owner = drafts[draft.parent]
        assert owner.role == "parent"
        assert owner.start <= draft.start and draft.end <= owner.end
        assert draft.token_count <= child and draft.token_count == TK.count(draft.text)
    for parent_index, owner in enumerate(drafts):
        if owner.role != "parent":
            continue
        children = [d for d in drafts if d.parent == parent_index]
        assert children
        # 子块紧跟在父块之后，且覆盖父块全部非空白字符、满足子块重叠属性
        assert drafts[parent_index + 1 : parent_index + 1 + len(children)] == children
        local = [ChunkDraft(c.text, c.start - owner.start, c.end - owner.start, (), c.token_count) for c in children]
        assert_covered(owner.text, local)
        assert_overlap(owner.text, local, overlap,
                       {h - owner.start for h in headings if owner.start <= h < owner.end})


# ---------------------------------------------------------------------------
# 性能：200 KB 中文
# ---------------------------------------------------------------------------

BID_EXCERPT = """# 第一章 招标公告

## 1.1 项目概况

本招标项目为某市公共资源交易中心智能化改造工程，招标人为某市公共资源交易中心，建设资金来自财政拨款，项目出资比例为100%。项目已具备招标条件，现对该项目进行公开招标。本项目不接受联合体投标。

## 1.2 投标人资格要求

投标人须具备独立法人资格，并具有建筑智能化系统设计专项乙级及以上资质。投标人拟派项目经理须具备机电工程专业二级及以上注册建造师执业资格，且未担任其他在建工程项目的项目经理。近三年内，投标人不得有行贿犯罪记录；被列入失信被执行人名单的，不得参加投标！

| 序号 | 资格条件 | 证明材料 |
|---|---|---|
| 1 | 独立法人资格 | 营业执照副本复印件，须加盖公章。 |
| 2 | 资质要求 | 资质证书复印件。 |
| 3 | 信誉要求 | 信用中国网站查询截图。 |

## 1.3 招标文件的获取

凡有意参加投标者，请于2024年3月1日至2024年3月7日，登录电子交易平台下载招标文件。招标文件每套售价500元，售后不退。投标人对招标文件有疑问的，应当在投标截止时间10日前以书面形式提出；招标人将以书面形式予以澄清。

## 1.4 投标文件的递交

投标文件递交的截止时间为2024年3月25日9时30分。逾期送达的投标文件，电子交易平台将予以拒收。开标时，由投标人或其推选的代表检查投标文件的密封情况？经确认无误后，由工作人员当众拆封。
"""


def make_chinese_document(target_bytes: int, seed: int = 7) -> str:
    rng = np.random.default_rng(seed)
    paragraphs = BID_EXCERPT.split("\n\n")
    out: list[str] = []
    size = 0
    chapter = 0
    while size < target_bytes:
        chapter += 1
        # 打乱段落顺序并替换数字，避免完全重复的文本命中 tokenizer 的词缓存
        for index in rng.permutation(len(paragraphs)):
            block = paragraphs[int(index)].replace("1.", f"{chapter}.").replace("2024", str(2000 + chapter % 99))
            block = block.replace("本", "该" if rng.random() < 0.5 else "本", 1)
            out.append(block)
            size += len(block.encode())
    return "\n\n".join(out)


@pytest.mark.slow
def test_chunking_200kb_chinese_is_fast() -> None:
    markdown = make_chinese_document(200 * 1024)
    assert len(markdown.encode()) >= 200 * 1024
    timings = {}
    for strategy in ("token", "semantic", "recursive", "parent_child"):
        options = ChunkingOptions.for_strategy(strategy)
        started = time.perf_counter()
        drafts = chunk_text(markdown, options, tokenizer=TK, embed=hash_embed)
        timings[strategy] = time.perf_counter() - started
        assert drafts
    # 宽松的上限，防止 O(n²) 回归；实测单核约 0.2-0.4 s
    assert timings["token"] < 5.0, timings
    assert max(timings.values()) < 10.0, timings


# ---------------------------------------------------------------- paragraph（知识条目的默认）


def test_paragraph_chunks_keep_paragraphs_apart_and_headings_with_their_text() -> None:
    from raglib.chunking.paragraphs import paragraph_spans

    text = "# 付款方式\n\n预付三成。\n\n  \n验收后付清。\n\n" + "长段落。" * 300 + "\n\n## 附录"
    spans = paragraph_spans(text, 1000, 200)
    pieces = [text[s:e] for s, e in spans]
    assert pieces[0] == "# 付款方式\n\n预付三成。"  # 只有标题的段并进下一段
    assert pieces[1] == "验收后付清。"
    assert all(len(p) <= 1000 for p in pieces) and "".join(pieces[2:-1]).count("长段落") >= 300
    assert pieces[-1] == "## 附录"  # 结尾只剩标题：自成一块
    assert all(p == p.strip() for p in pieces)


@given(st.lists(st.text(alphabet="ab。 \n", min_size=1, max_size=60), min_size=1, max_size=8))
def test_paragraph_chunks_never_cross_a_blank_line(paragraphs: list[str]) -> None:
    from raglib.chunking.paragraphs import paragraph_spans

    text = "\n\n".join(paragraphs)
    for start, end in paragraph_spans(text, 40, 10):
        piece = text[start:end]
        assert piece and piece == piece.strip() and len(piece) <= 40
        assert not re.search(r"\n[ \t\r\f\v]*\n", piece) or piece.lstrip().startswith("#")
