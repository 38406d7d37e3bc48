"""参照 BM25：在 Python 里对知识库的同一批分块算教科书 BM25，作为全文检索一路的对照线。

它与服务的实现刻意无关（不走数据库统计、不走服务的切词），所以能发现服务这一路的缺陷：

- 切词：小写后按 ``\\w+`` 切开；汉字（含繁体、日文汉字）串拆成单字 + 相邻字 bigram，其余串整体一个词；
  无停用词、无词干、无繁简转换——与数据集 SOURCE.md 里 BM25 基线的做法相同；
- 打分：Lucene 的 IDF ``ln(1 + (N - df + 0.5)/(df + 0.5))``，k1 = 0.9，b = 0.4（同上）；
- 文档：分块的 ``chunk_text``（即返回给用户的文本），不含服务额外加权的标题字段。
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

K1 = 0.9
B = 0.4

_WORD_RE = re.compile(r"\w+")
_HAN_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


def reference_tokens(text: str) -> list[str]:
    """小写 → ``\\w+`` 串；汉字串拆成单字与 bigram，其余部分整体成词。"""
    tokens: list[str] = []
    for word in _WORD_RE.findall(text.lower()):
        last = 0
        for match in _HAN_RE.finditer(word):
            if match.start() > last:
                tokens.append(word[last:match.start()])
            run = match.group()
            tokens.extend(run)
            tokens.extend(run[i:i + 2] for i in range(len(run) - 1))
            last = match.end()
        if last < len(word):
            tokens.append(word[last:])
    return tokens


@dataclass
class ReferenceIndex:
    """内存里的倒排表：词 → [(文档序号, 词频)]。"""

    keys: list[int]
    postings: dict[str, list[tuple[int, int]]]
    lengths: list[int]
    avgdl: float

    @classmethod
    def build(cls, documents: Iterable[tuple[int, str]]) -> ReferenceIndex:
        keys: list[int] = []
        lengths: list[int] = []
        postings: dict[str, list[tuple[int, int]]] = {}
        for index, (key, text) in enumerate(documents):
            tokens = reference_tokens(text)
            keys.append(key)
            lengths.append(len(tokens))
            for token, tf in Counter(tokens).items():
                postings.setdefault(token, []).append((index, tf))
        avgdl = sum(lengths) / len(lengths) if lengths else 0.0
        return cls(keys, postings, lengths, avgdl)

    def search(self, query: str, limit: int) -> list[tuple[int, float]]:
        """按 BM25 降序的前 ``limit`` 个 (key, 分数)；同分按 key 升序。查询里重复的词按次数计。"""
        n = len(self.keys)
        scores: dict[int, float] = {}
        for token, qtf in Counter(reference_tokens(query)).items():
            postings = self.postings.get(token)
            if not postings:
                continue
            idf = math.log(1.0 + (n - len(postings) + 0.5) / (len(postings) + 0.5))
            for index, tf in postings:
                norm = K1 * (1 - B + B * self.lengths[index] / self.avgdl)
                scores[index] = scores.get(index, 0.0) + qtf * idf * tf * (K1 + 1) / (tf + norm)
        ranked = sorted(scores.items(), key=lambda item: (-item[1], self.keys[item[0]]))[:limit]
        return [(self.keys[index], score) for index, score in ranked]


