"""中文全文检索的构件：在 Python 里生成 tsvector / tsquery 字面量，SQL 中用 ``%s::tsvector``、``%s::tsquery`` 转换。

为什么不用 ``to_tsvector``：服务器上没有中文解析器（zhparser），默认解析器对 CJK 的切分又取决于服务器 locale，
同一段文本在不同部署上会得到不同的词位。这里的全部处理与数据库 locale 无关：

- 归一化：NFKC（全角 → 半角）→ 繁体 → 简体（OpenCC t2s）→ 小写；
- 切词（``RAG_FULLTEXT_ANALYZER``）：其余按“字母/数字串”切开，英文词做 Snowball 词干（running/runs → run），
  数字保留，标点与空白丢弃；汉字串有两种切法：
  - ``bigram``（默认）：每个字起一个字 bigram（“高血压药” → 高血/血压/压药），串尾的字再单独一个 unigram（药），
    于是每个汉字正好占一个位置。与分词词典无关：新词、错别字、“伪原创”换词、繁简混排都不漏；
    在开发集上与 jieba 词的对比见 docs/EVALUATION.md（BM25 下 bigram 明显更好，且每个查询的词位更少）。
    查询里孤立的单字用前缀匹配（``'肝':*``），能命中以它开头的任何 bigram；
  - ``jieba``：精确模式的词，搜索模式切出的子词（中华人民共和国 → 中华/华人/人民/共和/共和国）与所属的词同一位置；
- 位置：每个词占一个位置（从 1 开始，上限 16383，与 PostgreSQL 一致），所以相邻词之间的短语查询（``<->``）成立；
- 停用词（虚词、疑问词）保留在文档里（短语与精确匹配仍然成立），只从查询词里去掉；
  整个查询都是停用词时保留原词，停用词永远不会让查询变空。bigram 模式下汉字不做停用词处理：
  BM25 的 IDF 自然压低“的是”“什么”这类高频 bigram。

查询语法见 :func:`parse_query`。
"""

from __future__ import annotations

# jieba、opencc、snowballstemmer 在函数里导入：词典加载要几秒，只在第一次切词时（或预热时）付这笔开销。
import logging
import re
import threading
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Literal

__all__ = [
    "HAN_CHARS",
    "MAX_POSITION",
    "ParsedQuery",
    "QueryTerm",
    "QueryType",
    "Word",
    "chunk_titles",
    "document_terms",
    "document_tsvector",
    "is_han",
    "normalize",
    "parse_query",
    "quote_lexeme",
    "tokenize",
    "warm_up",
    "word_lexeme",
]

# PostgreSQL 的限制：位置上限 16383（超出的位置被压到 16383）、每个词位最多 256 个位置、
# 单个词位不超过 2047 字节、整个 tsvector 不超过 1 MB
MAX_POSITION = 16383
MAX_POSITIONS_PER_LEXEME = 256
MAX_TSVECTOR_BYTES = 900_000
# 更长的“词”基本是哈希、base64 之类，检索无意义；文档与查询同样丢弃，保证两边一致
MAX_TOKEN_CHARS = 100
# 查询只看前这么多字符、最多这么多个词位 / 短语长度，防止超长输入拖慢数据库
MAX_QUERY_CHARS = 1000
MAX_QUERY_LEXEMES = 64
MAX_PHRASE_WORDS = 64

# 汉字（含〇、扩展 A、兼容区与扩展 B 之后的平面），正则字符类的内容
HAN_CHARS = "\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
# 汉字串交给 jieba；其余字母/数字（任何文字）连成一个词，版本号、小数里的点保留（3.14、v2.0）
_TOKEN_RE = re.compile(rf"(?P<han>[{HAN_CHARS}]+)|(?P<word>[^\W_{HAN_CHARS}]+(?:(?<=\d)\.\d+)*)")
_LATIN_RE = re.compile(r"[a-zà-ɏ]+")

# 中文停用词：虚词、代词、疑问词（查询多是“……是由谁开发的？”这样的自然问句）
CHINESE_STOPWORDS = frozenset("""
的 了 是 在 和 与 及 或 也 都 就 而 被 把 吗 呢 吧 啊 呀 嘛 哦 么 之 其 于 以 为 由 从 对 向 将 等 着 过 所 得 地
个 些 这 那 这个 那个 这些 那些 这里 那里 这样 那样 此 该 各 每 某 一个 一些 一种 有 没有 还 又 并 且 或者 以及
还是 而且 并且 如果 因为 所以 但是 但 却 只是 就是 即 既 若 则 我 你 他 她 它 我们 你们 他们 她们 它们 自己
什么 啥 哪 哪些 哪个 哪里 哪儿 谁 何 何时 何地 如何 怎么 怎样 怎么样 为什么 为何 多少 几 几个 是否 是不是 能否
可否 请问 请 吗 呢 的话 一下 呗
""".split())  # noqa: SIM905 - 空白分隔的词表比列表字面量好读好改

ENGLISH_STOPWORDS = frozenset("""
a an the of to in on at for by with from as into onto about over under up down out off than then so such
is are was were be been being am do does did doing have has had having will would shall should can could
may might must and or but if not no nor this that these those it its i me my we our you your he him his
she her they them their what who whom whose which when where why how there here all any both each few more
most other some only own same too very just
""".split())  # noqa: SIM905


Analyzer = Literal["bigram", "jieba", "jieba_bigram"]


@dataclass(frozen=True, slots=True)
class Word:
    """占一个位置的词：词位、是否停用词、搜索模式的子词（jieba 模式，与它同一位置）。

    bigram 模式的两个标记只影响查询：``prefix`` 是孤立的单字（查询时用前缀匹配），``tail`` 是多字汉字串
    串尾的 unigram（文档里它只出现在串尾，查询时只在短语中间用来衔接后面的英文/数字词）。
    """

    lexeme: str
    stop: bool = False
    subwords: tuple[str, ...] = ()
    prefix: bool = False
    tail: bool = False


# ---------------------------------------------------------------- 懒加载的 jieba / OpenCC / 词干器

# 两把锁分开：构造 OpenCC 快速路径时要用 jieba 的词频，同一把（不可重入的）锁会死锁
_jieba_lock = threading.Lock()
_t2s_lock = threading.Lock()
_jieba: Any = None
_t2s: _T2S | None = None
_local = threading.local()


class _T2S:
    """OpenCC t2s 转换器 + 快速路径。

    opencc-python-reimplemented 是纯 Python 实现，2000 字要几毫秒；而简体文本转换后不变。
    ``_triggers`` 是一个字符集：任何“转换后会改变”的词条都至少含其中一个字，所以一段文字里
    一个都没有时可以跳过转换（结果必然不变）。OpenCC 本身就按标点把文本切成小段分别转换，
    这里只转换含触发字的小段，结果与整段 ``convert`` 相同。
    """

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
        # 少数词条（如“瞭解”→“了解”）里没有单字会变的字：取其中最罕见的字（按 jieba 词频）作触发字，
        # 避免“一”“不”这样的常用字让几乎所有文本都走慢路径
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
        with _t2s_lock:
            if _t2s is None:
                _t2s = _T2S()
    return _t2s


def _tokenizer() -> Any:
    """已初始化的 jieba 默认分词器（首次调用加载词典，约 1 秒）。"""
    global _jieba
    if _jieba is None:
        with _jieba_lock:
            if _jieba is None:
                import jieba

                jieba.setLogLevel(logging.WARNING)  # 不要 "Building prefix dict ..." 之类的日志
                jieba.dt.initialize()
                _jieba = jieba.dt
    return _jieba


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    # Snowball 词干器对象有内部状态，不能跨线程共用：每个线程一个
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        import snowballstemmer

        stemmer = _local.stemmer = snowballstemmer.stemmer("english")
    return str(stemmer.stemWord(word))


def warm_up() -> None:
    """预先加载 jieba 词典、OpenCC 词典与词干器，避免第一个请求多等约 1 秒。"""
    _tokenizer()
    _converter()
    _stem("running")


# ---------------------------------------------------------------- 归一化与切词


def normalize(text: str) -> str:
    """NFKC（全角 → 半角）、繁体 → 简体、小写。"""
    return _converter().convert(unicodedata.normalize("NFKC", text)).lower()


# ---------------------------------------------------------------- 繁简写法

_HAN_CHAR = re.compile(f"[{HAN_CHARS}]")
_s2t: Any = None
# 一批文本里汉字不到这么多时不判断写法（英文库、数字为主的库）
_SCRIPT_MIN_HAN = 200
# 繁体文本经 t2s 会改变的汉字通常占一到三成，简体文本为 0：取一个远离两边的阈值
_HANT_SHARE = 0.03
# 看够这么多汉字就下结论：一成对零的差别，几千字早已分明。不设上限时没拟合过的 10 万块的库每 5 秒要在某个检索请求里
# 转换 200 个分块（约 5 万字，27~34 ms），拟合时要转换整个库
_SCRIPT_MAX_HAN = 5000


def text_script(texts: Iterable[str]) -> str:
    """一批文本的汉字写法：``"hant"``（繁体为主）、``"hans"``（简体为主），汉字太少时为 ``""``。

    按顺序读，看够 ``_SCRIPT_MAX_HAN`` 个汉字就停（后面的文本不再读取）。"""
    han = changed = 0
    converter = _converter()
    for text in texts:
        chars = _HAN_CHAR.findall(text)[:_SCRIPT_MAX_HAN - han]
        if not chars:
            continue
        han += len(chars)
        run = "".join(chars)
        changed += sum(a != b for a, b in zip(run, converter.convert(run), strict=False))
        if han >= _SCRIPT_MAX_HAN:
            break
    if han < _SCRIPT_MIN_HAN:
        return ""
    return "hant" if changed / han > _HANT_SHARE else "hans"


def in_script(text: str, script: str) -> str:
    """把文本转成给定写法（``hans`` 简体、``hant`` 繁体，其他原样返回）。

    全文一路两边都先转简体，繁简天然互通；向量一路比的是模型对原文的理解，繁体问题问简体库（或反过来）时
    相似度普遍偏低。检索时把问题转成知识库的写法再算向量（见 search.services），两边就是同一种写法。
    """
    if script == "hans":
        return _converter().convert(text)
    if script == "hant":
        global _s2t
        if _s2t is None:
            from opencc import OpenCC

            _s2t = OpenCC("s2t")
        return str(_s2t.convert(text))
    return text


def _segment(run: str) -> tuple[Word, ...]:
    """一段纯汉字交给 jieba：精确模式的词 + 搜索模式的子词（与 jieba ``mode="search"`` 的规则相同：
    长于 2 字的词取词典里有的 2 字子串，长于 3 字的再取 3 字子串）。"""
    dt = _tokenizer()
    freq = dt.FREQ
    words = []
    for word in dt.cut(run, HMM=True):
        if len(word) > MAX_TOKEN_CHARS:
            continue
        subwords: list[str] = []
        if len(word) > 2:
            subwords.extend(gram for i in range(len(word) - 1) if freq.get(gram := word[i:i + 2]))
        if len(word) > 3:
            subwords.extend(gram for i in range(len(word) - 2) if freq.get(gram := word[i:i + 3]))
        words.append(Word(word, word in CHINESE_STOPWORDS, tuple(dict.fromkeys(subwords))))
    return tuple(words)


# 两个标点之间的短句经常重复（分块重叠、页眉页脚、标题路径、热门查询）：缓存其切词结果
_segment_cached = lru_cache(maxsize=16384)(_segment)


def _han_words(run: str) -> tuple[Word, ...]:
    return _segment_cached(run) if len(run) <= 64 else _segment(run)


def _bigram_lexemes(run: str) -> list[str]:
    """一段纯汉字 → 每个字一个位置：字 bigram，串尾补一个 unigram；单字的串就是它自己。"""
    return [*(run[i:i + 2] for i in range(len(run) - 1)), run[-1]]


def _bigrams(run: str) -> list[Word]:
    """:func:`_bigram_lexemes` 加上查询要的标记：单字的串可前缀匹配，多字串串尾的 unigram 是 ``tail``。"""
    if len(run) == 1:
        return [Word(run, prefix=True)]
    *grams, last = _bigram_lexemes(run)
    return [*(Word(gram) for gram in grams), Word(last, tail=True)]


def _bigrams_and_words(run: str) -> list[Word]:
    """字 bigram 之上，把 jieba 切出的 3 字及以上的词（2 字词就是 bigram）挂在它首字的位置上，与那个 bigram 同位。"""
    words = _bigrams(run)
    if len(run) < 3:
        return words
    extra: dict[int, list[str]] = {}
    for word, start, end in _tokenizer().tokenize(run, HMM=True):
        if 3 <= end - start <= MAX_TOKEN_CHARS and word not in CHINESE_STOPWORDS:
            extra.setdefault(start, []).append(word)
    return [replace(word, subwords=tuple(extra[i])) if i in extra else word for i, word in enumerate(words)]


_HAN_SPLITTERS: dict[str, Callable[[str], Sequence[Word]]] = {
    "bigram": _bigrams, "jieba": _han_words, "jieba_bigram": _bigrams_and_words,
}


def is_han(lexeme: str) -> bool:
    """汉字的词位（字二元、单字、jieba 的词）；否则是字母、数字的词。切词不把两者连成一个词位。"""
    return _HAN_CHAR.match(lexeme) is not None


def word_lexeme(word: str) -> str | None:
    """字母/数字串的词位：过长的丢弃，拉丁字母的词取词干，其余（数字、版本号、其他文字）原样。"""
    if len(word) > MAX_TOKEN_CHARS:
        return None
    return _stem(word) if _LATIN_RE.fullmatch(word) else word


def _other_word(word: str) -> Word | None:
    lexeme = word_lexeme(word)
    if lexeme is None:
        return None
    return Word(lexeme, word in ENGLISH_STOPWORDS)  # 停用词表全是拉丁字母的词


def tokenize(text: str, analyzer: Analyzer | str) -> list[Word]:
    """把文本切成词序列（先 :func:`normalize`），每个词一个位置；标点与空白不产生词。

    ``analyzer`` 由调用方传入（服务里是 ``RAG_FULLTEXT_ANALYZER``）；文档与查询必须用同一种切法。
    """
    split = _HAN_SPLITTERS[analyzer]
    words: list[Word] = []
    for match in _TOKEN_RE.finditer(normalize(text)):
        han = match.group("han")
        if han is not None:
            words.extend(split(han))
        elif (word := _other_word(match.group("word"))) is not None:
            words.append(word)
    return words


def _document_lexemes(text: str, analyzer: Analyzer | str) -> tuple[list[str], list[bool] | None]:
    """文档一侧的切词：(词位, 各词位是否占一个新位置)；后者为 ``None`` 表示每个词位各占一个位置（bigram 切法）。

    与 :func:`tokenize` 切出同样的位置与词位（jieba 的子词紧跟在所属的词后面、与它同位），只是不构造
    :class:`Word`：查询才用得上停用词、前缀这些标记，而摄取每个分块要切几百个词，逐个构造对象、逐个调函数
    曾占切词耗时的大半（bench/pages/fulltext_engine.md，“切词的开销”）。
    """
    lexemes: list[str] = []
    starts: list[bool] | None = None if analyzer == "bigram" else []
    for match in _TOKEN_RE.finditer(normalize(text)):
        run = match.group("han")
        if run is None:
            if (lexeme := word_lexeme(match.group("word"))) is not None:
                lexemes.append(lexeme)
                if starts is not None:
                    starts.append(True)
        elif starts is None:
            lexemes.extend(_bigram_lexemes(run))
        else:
            for word in _HAN_SPLITTERS[analyzer](run):
                lexemes.append(word.lexeme)
                lexemes.extend(word.subwords)
                starts.append(True)
                starts.extend([False] * len(word.subwords))
    return lexemes, starts


# ---------------------------------------------------------------- tsvector


def quote_lexeme(lexeme: str) -> str:
    """tsvector / tsquery 字面量里的一个词位：单引号包起来，内部的单引号加倍、反斜杠转义。"""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


class _VectorBuilder:
    """按词位累积位置与权重；同一位置只记一次（先到的权重优先：标题先写入）。

    位置只增不减（标题在前、各部分之间空一位），所以一个词位的位置列表天然有序，重复的位置只会紧挨着出现
    （超过 ``MAX_POSITION`` 被压到同一位置时）：与列表里最后一个比较就够了。
    """

    def __init__(self, analyzer: Analyzer | str) -> None:
        self.analyzer = analyzer
        # 词位 → [最后一个位置, "位置权重", ...]
        self.entries: dict[str, list[Any]] = {}
        self.position = 0
        self.size = 0
        # 词数（不含各部分之间的空位）：BM25 的文档长度
        self.length = 0

    def add_text(self, text: str, weight: str) -> None:
        lexemes, starts = _document_lexemes(text, self.analyzer)
        if not lexemes:
            return
        if self.position:
            self.position += 1  # 各部分之间空一个位置：短语查询不会跨越标题与正文的边界
        self.length += len(lexemes) if starts is None else sum(starts)
        # 每个分块几百个词：循环里只用局部变量、不调函数（逐词调方法曾占切词耗时的三分之一）
        entries, size, position, at, mark = self.entries, self.size, self.position, 0, ""
        for index, lexeme in enumerate(lexemes):
            if starts is None or starts[index]:
                position += 1
                at = position if position < MAX_POSITION else MAX_POSITION
                mark = f"{at}{weight}"
            positions = entries.get(lexeme)
            if positions is None:
                grow = len(lexeme.encode("utf-8")) + 8
                if size + grow > MAX_TSVECTOR_BYTES:
                    continue
                size += grow
                positions = entries[lexeme] = [0]
            if positions[0] != at and len(positions) <= MAX_POSITIONS_PER_LEXEME:
                positions[0] = at
                positions.append(mark)
                size += 2
        self.size, self.position = size, position

    def literal(self) -> str:
        # 词位按 UTF-8 字节序写出：PostgreSQL 存 tsvector 的顺序，字面量因此就是 ``::tsvector::text`` 的规范文本
        # （分块存的正是它，见 documents.0013：排好序的词位共享前缀，pglz 才压得动）
        entries = sorted(self.entries.items(), key=lambda item: item[0].encode("utf-8"))
        return " ".join(quote_lexeme(lexeme) + ":" + ",".join(positions[1:]) for lexeme, positions in entries)


def document_terms(body: str, titles: Sequence[str] = (), *, analyzer: Analyzer | str) -> tuple[str, int]:
    """分块的 (tsvector 字面量, 词数)：标题部分（文件名、文档标题、标题路径）权重 A 且位置在前，正文权重 B。

    例：``'中国':1A,5B 'run':3B``；没有任何词时是 ``''``（空 tsvector）。词数是 BM25 的文档长度，标题与正文都算。
    """
    builder = _VectorBuilder(analyzer)
    for title in titles:
        builder.add_text(title, "A")
    builder.add_text(body, "B")
    return builder.literal(), builder.length


def document_tsvector(body: str, titles: Sequence[str] = (), *, analyzer: Analyzer | str) -> str:
    """:func:`document_terms` 的 tsvector 部分。"""
    return document_terms(body, titles, analyzer=analyzer)[0]


def chunk_titles(filename: str, title: object = None, heading_path: Iterable[object] = ()) -> list[str]:
    """参与全文索引（权重 A）的标题部分：文档标题、文件名（去扩展名）、标题路径；去空、去重。

    摄取与回填迁移共用，保证两处算出的 tsvector 一致。参数来自 JSON 元数据，非字符串的值被忽略。
    """
    stem = re.split(r"[\\/]", filename)[-1] if isinstance(filename, str) else ""
    if "." in stem.strip("."):
        stem = stem.rsplit(".", 1)[0]
    headings = [heading_path] if isinstance(heading_path, str) else heading_path
    parts = [title if isinstance(title, str) else "", stem, *(part for part in headings if isinstance(part, str))]
    return list(dict.fromkeys(part.strip() for part in parts if part.strip()))


# ---------------------------------------------------------------- 查询解析

QueryType = Literal["plain", "phrase", "boolean", "exact"]


@dataclass(frozen=True, slots=True)
class QueryTerm:
    """BM25 打分用的一个查询词：词位、是否前缀匹配、在查询里出现的次数。"""

    lexeme: str
    prefix: bool = False
    count: int = 1

    @property
    def operand(self) -> str:
        """tsquery 里的写法：``'词'`` 或 ``'词':*``。"""
        return quote_lexeme(self.lexeme) + (":*" if self.prefix else "")

    @property
    def han(self) -> bool:
        """汉字的词位（字二元、单字、jieba 的词）；否则是字母、数字的词。切词不把两者连成一个词位。"""
        return is_han(self.lexeme)


@dataclass(frozen=True, slots=True)
class ParsedQuery:
    """:func:`parse_query` 的结果。

    - ``tsquery``：用于 ``search_vector @@ %s::tsquery`` 的字面量；空串表示没有可检索的词，应跳过全文检索；
    - ``rank_tsquery``：用于 ``ts_rank_cd`` 的字面量。phrase 类型里它在必需短语之外再 OR 上其余词，
      让覆盖更多词的分块排名更高；其他类型与 ``tsquery`` 的正向部分相同；
    - ``terms``：BM25 打分的查询词（正向部分的全部词，去重计数）；
    - ``phrases``：仅 exact 类型有值，是用户输入的引号内原文（未归一化），SQL 应再要求
      ``strpos(lower(chunk_text), lower(phrase)) > 0``；
    - ``exclude``：boolean 类型中 ``-词`` 的 OR 组合（或空串），方便向量检索一路也排除这些分块；
    - ``required``：满足 ``tsquery`` 的分块必定含有的词（词位, 是否前缀）：短语与 exact 里串起来的词，boolean 里
      不带 OR 的各项的词。BM25 据此在回表之前去掉不可能命中的候选（search.bm25），plain 查询没有。
    """

    type: QueryType
    tsquery: str
    phrases: tuple[str, ...] = ()
    rank_tsquery: str = ""
    exclude: str = ""
    terms: tuple[QueryTerm, ...] = ()
    required: tuple[tuple[str, bool], ...] = ()


# 引号串（英文双引号、全角双引号、中文弯引号、直角引号，可带前缀 -）| OR 运算符 | 空白分隔的词 | 其余单个字符
_LEX_RE = re.compile(
    r"""(?P<quote>-*(?:"[^"]*"|\uff02[^\uff02]*\uff02|“[^”]*”|「[^」]*」|『[^』]*』))"""
    r"""|(?P<or>(?<!\S)OR(?!\S)|\|)"""
    r"""|(?P<word>[^\s|"\uff02“「『]+)"""
    r"""|(?P<stray>\S)"""
)


@dataclass(slots=True)
class _Item:
    """查询里的一项：一个词（空白分隔）、一个引号短语，或 OR 运算符。"""

    kind: Literal["word", "quote", "or"]
    text: str = ""
    negated: bool = False
    words: list[Word] = field(default_factory=list)


def _lex(query: str, analyzer: Analyzer | str) -> list[_Item]:
    items: list[_Item] = []
    for match in _LEX_RE.finditer(query):
        kind = match.lastgroup
        if kind == "or":
            items.append(_Item("or"))
            continue
        if kind == "stray":
            continue
        text = match.group()
        start = match.start()
        at_word_start = start == 0 or query[start - 1].isspace() or query[start - 1] == "|"
        stripped = text.lstrip("-")
        # “-词”在词首才是排除；“-5”当作负数，不是排除
        negated = at_word_start and stripped != text and not stripped[:1].isdigit()
        if kind == "quote":
            inner = stripped[1:-1]
            item = _Item("quote", inner, negated, tokenize(inner, analyzer))
        else:
            word = stripped if negated else text
            item = _Item("word", word, negated, tokenize(word, analyzer))
        if item.words:  # 没有可检索词的项（纯标点、孤立的 “-”）直接忽略
            items.append(item)
    # 连续的 OR 合并为一个，开头与结尾的 OR 没有意义，丢掉
    items = [item for i, item in enumerate(items) if item.kind != "or" or (i and items[i - 1].kind != "or")]
    while items and items[-1].kind == "or":
        items.pop()
    return items


def _or(parts: Sequence[str]) -> str:
    parts = list(dict.fromkeys(parts))
    return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"


def _and(parts: Sequence[str]) -> str:
    parts = list(dict.fromkeys(parts))
    return parts[0] if len(parts) == 1 else "(" + " & ".join(parts) + ")"


def _operand(word: Word) -> str:
    return quote_lexeme(word.lexeme) + (":*" if word.prefix else "")


def _phrase_words(words: Sequence[Word]) -> list[Word]:
    """短语里要串起来的词：结尾的串尾 unigram 去掉（文档里这个字后面可能还有字，它就不是 unigram 了）。"""
    words = list(words[:MAX_PHRASE_WORDS])
    if len(words) > 1 and words[-1].tail:
        words.pop()
    return words


def _word_keys(words: Iterable[Word]) -> list[tuple[str, bool]]:
    """词的（词位, 是否前缀），去重、保持顺序：:attr:`ParsedQuery.required` 的元素。"""
    return list(dict.fromkeys((w.lexeme, w.prefix) for w in words))


def _chain(words: Sequence[Word]) -> str:
    """短语：词（含停用词，文档里也有）按相邻位置串起来。"""
    operands = [_operand(w) for w in _phrase_words(words)]
    return operands[0] if len(operands) == 1 else "(" + " <-> ".join(operands) + ")"


def _keep(words: Sequence[Word]) -> list[Word]:
    """去掉停用词与串尾 unigram（bigram 已覆盖那个字）；全是停用词时保留，停用词不会让查询变空。"""
    words = [w for w in words if not w.tail]
    content = [w for w in words if not w.stop]
    return content or words


def _count_terms(pairs: Iterable[tuple[str, bool]]) -> list[QueryTerm]:
    counts: dict[tuple[str, bool], int] = {}
    for pair in pairs:
        counts[pair] = counts.get(pair, 0) + 1
    return [QueryTerm(lexeme, prefix, count) for (lexeme, prefix), count in counts.items()][:MAX_QUERY_LEXEMES]


def _plain_terms(words: Sequence[Word]) -> list[QueryTerm]:
    """plain 查询的词：非停用词及其子词（子词是停用词的也去掉），全是停用词时保留全部；不含串尾 unigram。"""
    pairs: list[tuple[str, bool]] = []
    for word in _keep(words):
        pairs.append((word.lexeme, word.prefix))
        keep_stop_subwords = word.stop  # 只剩停用词时，子词也照单全收
        pairs.extend((sub, False) for sub in word.subwords if keep_stop_subwords or sub not in CHINESE_STOPWORDS)
    return _count_terms(pairs)


def _phrase_terms(words: Sequence[Word]) -> list[QueryTerm]:
    return _count_terms((w.lexeme, w.prefix) for w in _phrase_words(words))


def _boolean(items: Sequence[_Item]) -> ParsedQuery:
    clauses: list[list[str]] = []
    # 与 clauses 平行：每个子句各备选项用到的词；只有一个备选项的子句，它的词每个命中的分块都有
    clause_words: list[list[list[Word]]] = []
    excluded: list[str] = []
    terms: list[QueryTerm] = []
    pending_or = last_positive = False
    for item in items:
        if item.kind == "or":
            pending_or = True
            continue
        if item.negated:
            excluded.append(_chain(item.words))
            last_positive = pending_or = False
            continue
        if item.kind == "quote":
            used = _phrase_words(item.words)
            expression = _chain(item.words)
            terms.extend(_phrase_terms(item.words))
        else:
            used = _keep(item.words)[:MAX_QUERY_LEXEMES]
            expression = _and([_operand(w) for w in used])
            terms.extend(_count_terms((w.lexeme, w.prefix) for w in used))
        if pending_or and last_positive:
            clauses[-1].append(expression)
            clause_words[-1].append(used)
        else:
            clauses.append([expression])
            clause_words.append([used])
        last_positive, pending_or = True, False
    exclude = _or(excluded) if excluded else ""
    if not clauses:
        # 只有排除项：没有正向的词可检索（纯 NOT 查询无法走 GIN 索引，也没有排序依据）
        return ParsedQuery("boolean", "", exclude=exclude)
    positive = _and([_or(alternatives) for alternatives in clauses])
    tsquery = _and([positive, *(f"!{expression}" for expression in dict.fromkeys(excluded))])
    required = _word_keys(w for alternatives in clause_words if len(alternatives) == 1 for w in alternatives[0])
    return ParsedQuery("boolean", tsquery, rank_tsquery=positive, exclude=exclude, terms=_merge(terms),
                       required=tuple(required))


def _merge(terms: Iterable[QueryTerm]) -> tuple[QueryTerm, ...]:
    """合并各部分的查询词：同一词位的次数相加。"""
    return tuple(_count_terms((t.lexeme, t.prefix) for t in terms for _ in range(t.count)))


def parse_query(query: str, *, analyzer: Analyzer | str) -> ParsedQuery:
    """把用户查询解析成 tsquery 字面量。规则（按顺序判定）：

    1. **boolean**：含有效的 OR 运算符（两侧都有词的大写 ``OR``，或 ``|``），或有以 ``-`` 开头的词
       （在词首，如 ``-广告``、``-"机器 学习"``；``-5`` 这样后跟数字的视为负数）。相邻词之间是 AND，
       ``OR`` 把两侧的项合成一组备选，``-词`` 变成 ``!词``。未加引号的词取其精确模式的词 AND
       （去停用词），引号内是短语（``<->`` 串）。只有排除项时 ``tsquery`` 为空串（没有正向的词可检索），
       ``exclude`` 仍给出排除项。
    2. **exact**：整个查询只有一个引号串（``"…"``、``“…”``、``「…」``、``『…』`` 与全角双引号）。
       ``tsquery`` 是该串的短语，``phrases`` 是引号内的原文，SQL 另用 ``strpos`` 要求原文出现。
    3. **phrase**：引号串之外还有别的词，或有多个引号串。引号内的短语是必需的（彼此 AND），
       其余的词是可选的：不进入 ``tsquery``（不影响是否命中），只进入 ``rank_tsquery`` 抬高排名。
    4. **plain**：其余情况。查询按搜索模式切词（含子词）、去停用词后 OR 起来，
       自然语言问句也能命中，``ts_rank_cd`` 会让覆盖更多词的分块排得更前。

    任何输入都不会抛异常：不配对的引号、孤立的运算符、开头的 ``OR``、单独的 ``-``、纯标点、
    emoji、反斜杠、SQL 片段都只会被当作普通字符或忽略；结果总是合法的 tsquery 字面量，
    或者空串（没有可检索的词）。停用词只从查询词里去掉；全是停用词时保留原词。
    """
    query = query[:MAX_QUERY_CHARS]
    items = _lex(query, analyzer)
    terms = [item for item in items if item.kind != "or"]
    # 有效的 OR：两侧都是正向的项（与排除项相邻的 OR 没有意义，忽略）
    has_or = any(item.kind == "or" and not items[i - 1].negated and not items[i + 1].negated
                 for i, item in enumerate(items))
    if has_or or any(item.negated for item in terms):
        return _boolean(items)
    quotes = [item for item in terms if item.kind == "quote"]
    if len(terms) == 1 and quotes:
        tsquery = _chain(quotes[0].words)
        phrase = quotes[0].text.replace("\x00", "").strip()
        return ParsedQuery("exact", tsquery, (phrase,) if phrase else (), rank_tsquery=tsquery,
                           terms=tuple(_phrase_terms(quotes[0].words)),
                           required=tuple(_word_keys(_phrase_words(quotes[0].words))))
    if quotes:
        required = _and([_chain(item.words) for item in quotes])
        optional = _plain_terms([w for item in terms if item.kind == "word" for w in item.words])
        scored = _merge([*(t for item in quotes for t in _phrase_terms(item.words)), *optional])
        return ParsedQuery("phrase", required, rank_tsquery=_or([required, *(t.operand for t in optional)]),
                           terms=scored,
                           required=tuple(_word_keys(w for item in quotes for w in _phrase_words(item.words))))
    plain = _plain_terms([w for item in terms for w in item.words])
    tsquery = _or([t.operand for t in plain]) if plain else ""
    return ParsedQuery("plain", tsquery, rank_tsquery=tsquery, terms=tuple(plain))
