"""迁移 documents.0004 时 ``raglib/analysis.py`` 文档一侧的冻结副本：迁移 0003、0004 回填 tsvector 只用这里的代码。

为什么冻结：迁移是历史，必须在任何时候、对任何版本的代码都做同一件事。以前 0003 导入 ``raglib.analysis``、
0004 导入 ``search.bm25``，以后改了切词（换停用词、改位置规则、换词干器……）就会悄悄改掉这两个旧迁移的结果，
甚至因为函数改名、挪位置而让全新部署跑不完迁移。所以迁移不导入任何应用代码（.importlinter 里的契约检查这一点），
需要的逻辑在这里留一份当时的副本。

**刻意不与 raglib/analysis.py 保持同步**：以后改切词不要改这里，而是照常改 ``raglib.analysis``，
再让运维运行 ``manage.py rebuild_fulltext``（或新写一个迁移，带上它自己的冻结副本）。

只复制文档一侧需要的部分：归一化（NFKC → OpenCC t2s → 小写）、三种切法（bigram / jieba / jieba_bigram）的切词、
tsvector 字面量的构造、``chunk_titles`` 与 ``document_terms``；没有查询解析。词的停用词、前缀、串尾标记只影响查询，
这里不再携带，词位、位置、子词与权重和当时的实现逐一相同。只依赖标准库与第三方库（jieba、opencc、snowballstemmer），
不导入项目里的任何包。0003 也用这一份：它回填的结果总会被紧随其后的 0004 按同一份代码重算覆盖，两者用同一份才一致。
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any

# PostgreSQL 的限制：位置上限 16383、每个词位最多 256 个位置、整个 tsvector 不超过 1 MB
MAX_POSITION = 16383
MAX_POSITIONS_PER_LEXEME = 256
MAX_TSVECTOR_BYTES = 900_000
# 更长的“词”基本是哈希、base64 之类，丢弃
MAX_TOKEN_CHARS = 100

_HAN = "\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_TOKEN_RE = re.compile(rf"(?P<han>[{_HAN}]+)|(?P<word>[^\W_{_HAN}]+(?:(?<=\d)\.\d+)*)")
_LATIN_RE = re.compile(r"[a-zà-ɏ]+")

# 中文停用词：文档一侧只用于 jieba_bigram 切法里“不挂到 bigram 上的词”
CHINESE_STOPWORDS = frozenset("""
的 了 是 在 和 与 及 或 也 都 就 而 被 把 吗 呢 吧 啊 呀 嘛 哦 么 之 其 于 以 为 由 从 对 向 将 等 着 过 所 得 地
个 些 这 那 这个 那个 这些 那些 这里 那里 这样 那样 此 该 各 每 某 一个 一些 一种 有 没有 还 又 并 且 或者 以及
还是 而且 并且 如果 因为 所以 但是 但 却 只是 就是 即 既 若 则 我 你 他 她 它 我们 你们 他们 她们 它们 自己
什么 啥 哪 哪些 哪个 哪里 哪儿 谁 何 何时 何地 如何 怎么 怎样 怎么样 为什么 为何 多少 几 几个 是否 是不是 能否
可否 请问 请 吗 呢 的话 一下 呗
""".split())  # noqa: SIM905 - 与当时的 raglib/analysis.py 同一写法

# 一个位置上的词：(词位, 与它同一位置的子词)
Word = tuple[str, tuple[str, ...]]


# ---------------------------------------------------------------- 懒加载的 jieba / OpenCC / 词干器（迁移单线程运行）

_jieba: Any = None
_t2s: _T2S | None = None
_stemmer: Any = None


class _T2S:
    """OpenCC t2s 转换器 + 快速路径：只转换含“转换后会改变的字”的小段，结果与整段 ``convert`` 相同。"""

    def __init__(self) -> None:
        from opencc import OpenCC

        self._cc = OpenCC("t2s")
        self._triggers: frozenset[str] | None = self._build_triggers()

    def _build_triggers(self) -> frozenset[str] | None:
        cc = self._cc
        try:
            changing = [key for group in cc._dict_chain_data for _, _, mapping in group
                        for key, value in mapping.items() if value.split(" ")[0] != key]
            if not (callable(cc._convert) and hasattr(cc.split_chars_re, "split")):
                return None
        except (AttributeError, TypeError, ValueError):
            return None  # 库的内部结构变了：放弃快速路径，每次整段转换
        triggers = {key for key in changing if len(key) == 1}
        freq = _tokenizer().FREQ
        for key in changing:
            if not triggers.intersection(key):
                triggers.add(min(key, key=lambda char: freq.get(char, 0)))
        return frozenset(triggers)

    def convert(self, text: str) -> str:
        triggers, cc = self._triggers, self._cc
        if triggers is None:
            return str(cc.convert(text))
        if triggers.isdisjoint(text):
            return text
        parts = cc.split_chars_re.split(text)  # 偶数下标是文字，奇数下标是分隔符
        for i in range(0, len(parts), 2):
            if not triggers.isdisjoint(parts[i]):
                parts[i] = cc._convert(parts[i], cc._dict_chain_data)
        return "".join(parts)


def _converter() -> _T2S:
    global _t2s
    if _t2s is None:
        _t2s = _T2S()
    return _t2s


def _tokenizer() -> Any:
    """已初始化的 jieba 默认分词器。"""
    global _jieba
    if _jieba is None:
        import jieba

        jieba.setLogLevel(logging.WARNING)
        jieba.dt.initialize()
        _jieba = jieba.dt
    return _jieba


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    global _stemmer
    if _stemmer is None:
        import snowballstemmer

        _stemmer = snowballstemmer.stemmer("english")
    return str(_stemmer.stemWord(word))


# ---------------------------------------------------------------- 归一化与切词


def normalize(text: str) -> str:
    """NFKC（全角 → 半角）、繁体 → 简体、小写。"""
    return _converter().convert(unicodedata.normalize("NFKC", text)).lower()


def _segment(run: str) -> tuple[Word, ...]:
    """jieba 切法：精确模式的词 + 搜索模式的子词（长于 2 字取词典里有的 2 字子串，长于 3 字再取 3 字子串）。"""
    dt = _tokenizer()
    freq = dt.FREQ
    words: list[Word] = []
    for word in dt.cut(run, HMM=True):
        if len(word) > MAX_TOKEN_CHARS:
            continue
        subwords: list[str] = []
        if len(word) > 2:
            subwords.extend(gram for i in range(len(word) - 1) if freq.get(gram := word[i:i + 2]))
        if len(word) > 3:
            subwords.extend(gram for i in range(len(word) - 2) if freq.get(gram := word[i:i + 3]))
        words.append((word, tuple(dict.fromkeys(subwords))))
    return tuple(words)


_segment_cached = lru_cache(maxsize=16384)(_segment)


def _han_words(run: str) -> tuple[Word, ...]:
    return _segment_cached(run) if len(run) <= 64 else _segment(run)


def _bigrams(run: str) -> list[Word]:
    """bigram 切法：每个字一个位置，字 bigram，串尾补一个 unigram；单字的串就是那个字。"""
    if len(run) == 1:
        return [(run, ())]
    return [*((run[i:i + 2], ()) for i in range(len(run) - 1)), (run[-1], ())]


def _bigrams_and_words(run: str) -> list[Word]:
    """jieba_bigram 切法：字 bigram 之上，jieba 切出的 3 字及以上的非停用词挂在它首字的位置上。"""
    words = _bigrams(run)
    if len(run) < 3:
        return words
    extra: dict[int, list[str]] = {}
    for word, start, end in _tokenizer().tokenize(run, HMM=True):
        if 3 <= end - start <= MAX_TOKEN_CHARS and word not in CHINESE_STOPWORDS:
            extra.setdefault(start, []).append(word)
    return [(lexeme, tuple(extra[i])) if i in extra else (lexeme, subs) for i, (lexeme, subs) in enumerate(words)]


_HAN_SPLITTERS: dict[str, Callable[[str], Sequence[Word]]] = {
    "bigram": _bigrams, "jieba": _han_words, "jieba_bigram": _bigrams_and_words,
}


def _other_word(word: str) -> Word | None:
    if len(word) > MAX_TOKEN_CHARS:
        return None
    if _LATIN_RE.fullmatch(word):
        return (_stem(word), ())
    return (word, ())


def tokenize(text: str, analyzer: str) -> list[Word]:
    """归一化后切成词序列，每个词一个位置；标点与空白不产生词。"""
    split = _HAN_SPLITTERS[analyzer]
    words: list[Word] = []
    for match in _TOKEN_RE.finditer(normalize(text)):
        han = match.group("han")
        if han is not None:
            words.extend(split(han))
        elif (word := _other_word(match.group("word"))) is not None:
            words.append(word)
    return words


# ---------------------------------------------------------------- tsvector


def quote_lexeme(lexeme: str) -> str:
    """tsvector 字面量里的一个词位：单引号包起来，内部的单引号加倍、反斜杠转义。"""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


class _VectorBuilder:
    """按词位累积位置与权重；同一位置只记一次（先到的权重优先：标题先写入）。"""

    def __init__(self, analyzer: str) -> None:
        self.analyzer = analyzer
        self.entries: dict[str, dict[int, str]] = {}
        self.position = 0
        self.size = 0
        self.length = 0  # 词数（不含各部分之间的空位）：BM25 的文档长度

    def add(self, lexeme: str, position: int, weight: str) -> None:
        positions = self.entries.get(lexeme)
        if positions is None:
            size = len(lexeme.encode("utf-8")) + 8
            if self.size + size > MAX_TSVECTOR_BYTES:
                return
            self.size += size
            positions = self.entries[lexeme] = {}
        if len(positions) < MAX_POSITIONS_PER_LEXEME and position not in positions:
            positions[position] = weight
            self.size += 2

    def add_text(self, text: str, weight: str) -> None:
        words = tokenize(text, self.analyzer)
        if not words:
            return
        if self.position:
            self.position += 1  # 各部分之间空一个位置：短语查询不会跨越标题与正文的边界
        self.length += len(words)
        for lexeme, subwords in words:
            self.position += 1
            position = min(self.position, MAX_POSITION)
            self.add(lexeme, position, weight)
            for sub in subwords:
                self.add(sub, position, weight)

    def literal(self) -> str:
        return " ".join(
            quote_lexeme(lexeme) + ":" + ",".join(f"{pos}{weight}" for pos, weight in sorted(positions.items()))
            for lexeme, positions in self.entries.items()
        )


def document_terms(body: str, titles: Sequence[str] = (), *, analyzer: str) -> tuple[str, int]:
    """分块的 (tsvector 字面量, 词数)：标题部分权重 A 且位置在前，正文权重 B；没有任何词时是 ``''``。"""
    builder = _VectorBuilder(analyzer)
    for title in titles:
        builder.add_text(title, "A")
    builder.add_text(body, "B")
    return builder.literal(), builder.length


def chunk_titles(filename: str, title: object = None, heading_path: Iterable[object] = ()) -> list[str]:
    """参与全文索引（权重 A）的标题部分：文档标题、文件名（去扩展名）、标题路径；去空、去重；非字符串的值被忽略。"""
    stem = re.split(r"[\\/]", filename)[-1] if isinstance(filename, str) else ""
    if "." in stem.strip("."):
        stem = stem.rsplit(".", 1)[0]
    headings = [heading_path] if isinstance(heading_path, str) else heading_path
    parts = [title if isinstance(title, str) else "", stem, *(part for part in headings if isinstance(part, str))]
    return list(dict.fromkeys(part.strip() for part in parts if part.strip()))


def chunk_terms(text: str, metadata: object, analyzer: str) -> tuple[str, int]:
    """一个分块（正文 + JSON 元数据）的 (tsvector 字面量, 词数)，与当时摄取写入的一致。"""
    meta = metadata if isinstance(metadata, dict) else {}
    titles = chunk_titles(meta.get("filename") or "", meta.get("title"), meta.get("heading_path") or ())
    return document_terms(text, titles, analyzer=analyzer)
