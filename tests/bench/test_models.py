"""``bench/model_latency.py`` 用的随机权重模型：按 BGE-M3 的配置（这里缩到 1 层、hidden 32）构建的目录，
经用户会设置的那些 ``RAG_*`` 设置由真实的 flag 提供方加载；以及基准的计算量估算。"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.helpers.xlmr_models import BGE_M3_ARCHITECTURE, build_embedding_model, build_reranker_model
from bench.model_latency import pair_lengths, parameter_counts, request_flops
from infra.embedders import default_embedder
from raglib.providers.embedding import clear_embedding_providers
from raglib.providers.rerank import clear_rerankers
from search.rerankers import configured_reranker

# BGE-M3 的配置，只把大小缩到测试承受得起：其余（位置编码 8194、layer_norm_eps、type_vocab_size）照抄
TINY = {**BGE_M3_ARCHITECTURE, "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
        "intermediate_size": 64}
TEXTS = ["向量索引的召回率随 ef_search 增大而提高。", "The reranker scores query and passage pairs.",
         "混合检索用 RRF 融合两路结果。" * 40]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return (build_embedding_model(tmp_path_factory.mktemp("bench-embedding"), **TINY),
            build_reranker_model(tmp_path_factory.mktemp("bench-reranker"), **TINY))


@pytest.fixture
def flag_settings(settings: Any, model_dirs: tuple[Path, Path]) -> Iterator[Any]:
    """与用户部署下载好的模型时相同的设置：提供方 flag、模型为本地目录。"""
    clear_embedding_providers()
    clear_rerankers()
    embedding_dir, reranker_dir = model_dirs
    settings.EMBEDDING_PROVIDER, settings.EMBEDDING_MODEL, settings.EMBEDDING_DEVICE = "flag", str(embedding_dir), "cpu"
    settings.RERANK_PROVIDER, settings.RERANK_MODEL, settings.RERANK_DEVICE = "flag", str(reranker_dir), "cpu"
    yield settings
    clear_embedding_providers()
    clear_rerankers()


def test_directories_have_the_bge_m3_layout(model_dirs: tuple[Path, Path]) -> None:
    import torch

    embedding_dir, reranker_dir = model_dirs
    config = json.loads((embedding_dir / "config.json").read_text())
    assert {key: config[key] for key in TINY} == TINY and config["vocab_size"] == 250002
    assert json.loads((reranker_dir / "config.json").read_text())["architectures"] == [
        "XLMRobertaForSequenceClassification"]
    shapes = {name: {key: tuple(value.shape) for key, value in torch.load(embedding_dir / name).items()}
              for name in ("colbert_linear.pt", "sparse_linear.pt")}
    assert shapes == {"colbert_linear.pt": {"weight": (32, 32), "bias": (32,)},
                      "sparse_linear.pt": {"weight": (1, 32), "bias": (1,)}}
    total, encoder = parameter_counts(embedding_dir)
    # 词向量 250002x32 占绝大部分；编码器一层：4 个 32x32 注意力投影、32->64->32 的 FFN、两个 LayerNorm
    assert encoder == 4 * (32 * 32 + 32) + (32 * 64 + 64) + (64 * 32 + 32) + 2 * 2 * 32
    assert total > 250002 * 32 + encoder


def test_real_providers_load_the_directories_from_settings(flag_settings: Any) -> None:
    embedder = default_embedder()
    assert (embedder.provider, embedder.dimension) == ("flag", 32)
    assert embedder.embed_query("如何调大 ef_search？").shape == (32,)
    assert embedder.embed_documents(TEXTS).shape == (3, 32)
    reranker = configured_reranker()
    assert reranker is not None
    scores = reranker.rerank("召回率", TEXTS)
    assert len(scores) == 3 and all(0.0 <= score <= 1.0 for score in scores)


def test_rerank_flops_count_the_padding_of_length_sorted_batches() -> None:
    flops = request_flops([10, 30, 20, 40], batch_size=2, encoder_params=100, layers=1, hidden=1)
    # 降序 40,30 | 20,10：补齐后 40+40+20+20
    assert (flops.tokens, flops.padded_tokens) == (100, 120)
    assert flops.ideal == 2 * 100 * 100 + 4 * (10**2 + 30**2 + 20**2 + 40**2)
    assert flops.executed == 2 * 100 * 120 + 4 * 2 * (40**2 + 20**2)


def test_pair_lengths_truncate_like_the_reranker(model_dirs: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dirs[1]))
    lengths = pair_lengths(tokenizer, "召回率", TEXTS, max_length=64)
    assert lengths[2] == 64 and all(8 < length < 64 for length in lengths[:2])
