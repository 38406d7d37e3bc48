"""BM25 打分的纯函数（不碰数据库）：IDF、查询词的打分系数、单个查询可能的最高分、覆盖率、倒排读取额度的分配，
以及按词频直接算一个分块的分数。

打分公式（Lucene 的 IDF，BM25F 式字段权重）::

    score(d, q) = Σ_t  qtf_t · idf_t · tf_t·(k1+1) / (tf_t + k1·(1 - b + b·dl/avgdl))
    idf_t = ln(1 + (N - df_t + 0.5) / (df_t + 0.5))

``tf_t`` 是加权词频：正文出现一次记 1，标题部分记 ``title_weight``。字母、数字的词在不到 :data:`WORD_IDF_MIN_CHUNKS`
个分块的库里按那么多个分块算 IDF（:func:`term_idf`）。PostgreSQL 里的读取与统计在 ``search.bm25``。
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from raglib.analysis import QueryTerm


@dataclass(frozen=True)
class Bm25Params:
    k1: float
    b: float
    title_weight: float



@dataclass(frozen=True)
class ScoredTerm:
    """带统计的查询词：文档频率，以及 idf·qtf·(k1+1)（倒排行上的打分系数）。"""

    term: QueryTerm
    df: int
    idf: float
    weight: float


@dataclass(frozen=True)
class TermRead:
    """一个查询词要读的倒排：影响力最高的 ``rows`` 行（等于 df 时整条读完）。"""

    scored: ScoredTerm
    rows: int

    @property
    def truncated(self) -> bool:
        return self.rows < self.scored.df


def idf(df: int, n: int) -> float:
    """Lucene 的 BM25 IDF，总是正数：极常见的词接近 0，但不会变成负分。"""
    df = min(max(df, 0), n)
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


# 字母、数字的词（英文等）在分块很少的库里按至少这么多个分块算 IDF（:func:`term_idf`）。1 块的库里库里有的词 df = N，
# IDF 0.29，库里没有的词 1.39：问的正是这一块、只有一两个词不在块里的英文问题，匹配程度（BM25 分 ÷ 可能的最高分）只有
# 0.1~0.3。汉字的词不加：真实问题换了说法，与原文共有的字二元很少，加了之后伪查询与真实问题的匹配程度拉得更开，本库的
# 模型变陡，汉字小库的召回率低 3~20 个点。20：英文 1~4 段的库 0.5 处召回率全文 0.62 → 0.79、混合 0.64 → 0.75，20 块起的
# 库一位不变（docs/EVALUATION.md“字母、数字的词在不到 20 块的库里”、“BM25 本身的 IDF 也按至少 100 块算”）
WORD_IDF_MIN_CHUNKS = 20


def term_idf(term: QueryTerm, df: int, n: int) -> float:
    """查询词在 BM25 里的 IDF：汉字的词是 :func:`idf`；字母、数字的词的 N 至少按 :data:`WORD_IDF_MIN_CHUNKS` 算
    （多出来的分块当作不含这个词）。"""
    df = min(max(df, 0), n)
    return idf(df, n if term.han else max(n, WORD_IDF_MIN_CHUNKS))


def score_terms(terms: Sequence[QueryTerm], dfs: dict[tuple[str, bool], int], n: int,
                params: Bm25Params) -> list[ScoredTerm]:
    """按 IDF 从高到低（同 IDF 按词位）排好的查询词；知识库里没有的词（df=0）丢掉：它不会命中任何分块。"""
    scored = []
    for term in terms:
        df = dfs.get((term.lexeme, term.prefix), 0)
        if df <= 0:
            continue
        weight = term_idf(term, df, n) * term.count
        scored.append(ScoredTerm(term, df, weight, weight * (params.k1 + 1)))
    scored.sort(key=lambda s: (-s.idf, s.term.lexeme))
    return scored


def max_score(terms: Sequence[QueryTerm], dfs: dict[tuple[str, bool], int], n: int, k1: float) -> float:
    """一个分块在这个查询上可能得到的最高 BM25 分（每个词都饱和）；库里没有的词按 df=0 的最大 IDF 计入，
    所以只匹配了零星几个词的结果，分数相对它也低。"""
    if n <= 0:
        return 0.0
    return sum(term_idf(t, dfs.get((t.lexeme, t.prefix), 0), n) * t.count for t in terms) * (k1 + 1)


# 算覆盖率时库至少按这么多个分块算（:func:`coverage`）。100：开发集的库（393 块起）一位不变；squad 的 1~4 段的库
# 混合方式 0.5 处召回率 0.54 → 0.64，cmrc2018 的 6~26 块的库 0.79 → 0.82、hit@1 不降（docs/EVALUATION.md
# “覆盖率按至少 100 块的库算 IDF”）
COVERAGE_MIN_CHUNKS = 100


def coverage(terms: Sequence[QueryTerm], dfs: dict[tuple[str, bool], int], n: int) -> float:
    """查询的 IDF 质量里、知识库中真有的那部分所占比例（0~1）：全文这一路“听懂了”多少查询。

    没出现过的词按 df=0 的最大 IDF 计入分母。用另一种语言提问（英文问题查中文库）时，只有人名、数字等少数词
    能在库里找到，比例很低；用库里的语言提问时接近 1。融合按它调低全文一路的权重（见 raglib.fusion）。

    IDF 按至少 :data:`COVERAGE_MIN_CHUNKS` 个分块的库算（多出来的分块当作不含这些词）：分块很少的库里，库里有的词
    几乎每块都有，IDF 只有库里没有的词的几分之一——1 块的库里 df = N，IDF 0.29 对 1.39——问的正是这一块、只有一两个词
    不在块里的问题，覆盖率也只有 0.2~0.5，闸门把全文一路整个关掉。
    """
    if n <= 0 or not terms:
        return 0.0
    size = max(n, COVERAGE_MIN_CHUNKS)
    total = matched = 0.0
    for term in terms:
        df = dfs.get((term.lexeme, term.prefix), 0)
        weight = idf(df, size) * term.count
        total += weight
        matched += weight if df > 0 else 0.0
    return matched / total if total > 0 else 0.0


def allot_postings(terms: Sequence[ScoredTerm], budget: int) -> list[TermRead]:
    """把 ``budget`` 行倒排分给按 IDF 从高到低排好的查询词（按 IDF 加权“注水”）：每个词至多分到剩余额度里
    按它的 IDF 占剩余各词 IDF 之和的那一份，用不完的（df 更小）留给后面更常见的词。

    按 IDF 加权是因为一行倒排对分数的贡献与 IDF 成正比：同样截断，IDF 越低的词丢掉的分数越少。
    前缀词（孤立的单字）是一段词位范围，不能按影响力截断：整段读得起（df 即那一段的行数）才读，读不起就跳过，
    额度留给后面的词。至少读一个词，只含常见词的查询也有结果：一个都读不起时读最稀有的那个，最多读满额度
    （前缀词此时只读那一段的一部分，见 search.retrieval 里前缀那一支）。
    """
    reads: list[TermRead] = []
    remaining = budget
    weight_left = sum(term.idf for term in terms)
    for term in terms:
        if remaining <= 0:
            break
        share = max(int(remaining * term.idf / weight_left), 1) if weight_left > 0 else remaining
        weight_left -= term.idf
        if term.df <= share:
            reads.append(TermRead(term, term.df))
        elif not term.term.prefix:
            reads.append(TermRead(term, share))
        else:
            continue  # 前缀词截不断，读不起就跳过
        remaining -= reads[-1].rows
    if not reads and terms:
        reads.append(TermRead(terms[0], min(terms[0].df, max(budget, 1))))
    return reads


def chunk_score(terms: Sequence[ScoredTerm], counts: Mapping[str, tuple[int, int]], length: float,
                params: Bm25Params, avgdl: float) -> float:
    """一个分块的完整 BM25 分（不截断倒排）：``counts`` 是分块里各词位的 (标题次数, 正文次数)，``length`` 是词数。

    与倒排表上的 SQL 同一个公式：精确词一行一项；前缀词先把以它开头的各词位的加权词频相加再饱和。
    用来给没进全文一路名单的候选补上它真实的分数（见 search.retrieval.fulltext_scores）。
    """
    c0 = params.k1 * (1 - params.b)
    c1 = params.k1 * params.b / max(avgdl, 1e-9)
    total = 0.0
    for scored in terms:
        lexeme = scored.term.lexeme
        if scored.term.prefix:
            pairs = [pair for key, pair in counts.items() if key.startswith(lexeme)]
        else:
            pairs = [counts[lexeme]] if lexeme in counts else []
        tf = sum(params.title_weight * title + body for title, body in pairs)
        if tf > 0:
            total += scored.weight * tf / (tf + c0 + c1 * length)
    return total
