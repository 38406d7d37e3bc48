"""随机权重的 XLM-RoBERTa 模型目录（离线、确定性），供 flag 提供方的测试使用。

构建函数在 ``bench/helpers/xlmr_models.py``（基准脚本 ``bench/model_latency.py`` 也用它）；这里只有 pytest 夹具。

结构与 BGE-M3 / bge-reranker-v2-m3 相同（XLM-RoBERTa 编码器 + 随包的 250002 词表 tokenizer），目录布局也与
下载的模型相同（``save_pretrained`` 的权重与配置、tokenizer 文件，embedding 模型另有 M3 的
``colbert_linear.pt`` / ``sparse_linear.pt``），所以提供方按本地目录加载时走的是与真实模型完全相同的代码路径，
只是输出没有语义。

- 测试用极小配置（默认 hidden 32、2 层、2 头）：体积主要是词向量 250002 x 32 个 float32 ≈ 32 MB，再加 17 MB 的
  tokenizer.json；构建约数秒（大部分是导入 torch/transformers）。
- 基准用 :data:`BGE_M3_ARCHITECTURE` 覆盖配置，得到与 BGE-M3 大小完全相同的模型（约 5.7 亿参数，fp32 约 2.3 GB）。

用法：在测试模块里 ``from tests.model_fixtures import tiny_embedding_model_dir  # noqa: F401``，
然后把夹具名写进测试函数参数。夹具是 session 级，整个测试会话只构建一次。
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.helpers.xlmr_models import build_embedding_model, build_reranker_model


@pytest.fixture(scope="session")
def tiny_embedding_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """会话内共享的极小 embedding 模型目录（hidden 32）。"""
    return build_embedding_model(tmp_path_factory.mktemp("tiny-xlmr-embedding"))


@pytest.fixture(scope="session")
def tiny_reranker_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """会话内共享的极小重排序（sequence classification）模型目录。"""
    return build_reranker_model(tmp_path_factory.mktemp("tiny-xlmr-reranker"))
