"""查询词的邻近程度：一个分块里最集中的一句话，装下了查询的多少（按 IDF 加权）。

为什么要它：BM25 与向量相似度都只看整个分块。长文档切出的相邻分块讲的是同一件事，词都差不多，两路都分不清
“答案在哪一块”——squad 长文的混合方式漏掉的题里，大半是对了文章、错了分块。问题通常是照着原文某一句问的，
答案所在的那一块里，问题的词聚在同一句中；别的分块里同样的词散在各处。混合方式把这个特征加进排序
（``search.services``），见 docs/EVALUATION.md“一句话装下多少查询”。

只算查询词出现在哪一句，不为整个分块切词：逐词切词要给每个英文词取词干，一个 1,700 字符的分块约 1.3 ms，
20 个候选就是 25 ms；这里每个查询词在归一化的原文上查一遍，只给可能是它的词取词干。

“一句”与分块器的句子是同一个定义（:func:`raglib.chunking.sentences.sentence_spans`）：普通文本行之间的单个换行
不是句末。PDF 转出的正文在句子中间每行都有一个硬换行，按换行断句时一“句”只是一行，问题的词总被拆开
（docs/EVALUATION.md“硬换行的正文”）。

纯函数，不碰数据库。
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping

from raglib import analysis
from raglib.chunking.sentences import sentence_spans

# 词的边界：与 raglib.analysis 的切词一致——字母数字连成一个词，汉字与它们之间自然断开
_WORD_CHAR = re.compile(rf"[^\W_{analysis.HAN_CHARS}]")
_WORD_REST = re.compile(rf"[^\W_{analysis.HAN_CHARS}]*")


def _find_all(needle: str, text: str) -> list[int]:
    found, start = [], text.find(needle)
    while start >= 0:
        found.append(start)
        start = text.find(needle, start + 1)
    return found


def _positions(lexeme: str, text: str) -> list[int]:
    """词位在（归一化的）原文里出现的位置。

    字 bigram 与单字：原文里任意两个相邻汉字都是一个 bigram，直接找子串（单字的查询词本来就按前缀匹配）。
    字母、数字的词：找以词干去掉最后一个字母开头的整个词（英文的词干大多是原词的前缀，只有末尾可能改写，
    如 happy → happi），再取一次词干核对。只用子串查找与预编译的正则：每个查询词编译一个正则时，
    汉字字符类的编译每次约 2 ms，比查找本身贵得多。
    """
    if analysis.is_han(lexeme):
        return _find_all(lexeme, text)
    prefix = lexeme[:-1] if len(lexeme) > 3 else lexeme
    positions = []
    for start in _find_all(prefix, text):
        if start > 0 and _WORD_CHAR.match(text, start - 1):
            continue  # 在词的中间
        end = _WORD_REST.match(text, start + len(prefix))
        assert end is not None  # 可以匹配空串，总有结果
        if analysis.word_lexeme(text[start:end.end()]) == lexeme:
            positions.append(start)
    return positions


def sentence_share(text: str, weights: Mapping[str, float]) -> float:
    """``text`` 里最集中的一句话包含的查询词的权重之和 ÷ 全部查询词的权重之和（0~1）。

    ``weights``：查询词的词位 → 权重（检索服务传 BM25 的 IDF：常见词几乎不算数）。一个词在一句里出现几次都只算
    一次——要的是“这句话问到了问题的几个方面”，不是词频（词频 BM25 已经算过）。
    """
    total = sum(weights.values())
    if total <= 0:
        return 0.0
    normalized = analysis.normalize(text)
    # 每个非空白字符恰好落在一句里：按句首定位
    starts = [start for start, _ in sentence_spans(normalized)]
    found: dict[int, float] = {}
    for lexeme, weight in weights.items():
        # 同一句里出现几次只算一次
        for sentence in {bisect.bisect_right(starts, position) for position in _positions(lexeme, normalized)}:
            found[sentence] = found.get(sentence, 0.0) + weight
    return max(found.values(), default=0.0) / total
