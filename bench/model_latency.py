"""模型受限的延迟（issue #11 第 6 项）：BGE-M3 大小的随机权重模型，经项目真实的 flag 提供方计时。

    .venv/bin/python bench/model_latency.py                        # 本机（无 GPU 时为 CPU，fp32）
    .venv/bin/python bench/model_latency.py --device cuda \\
        --rerank-batch-sizes 32,8,4 --rerank-max-lengths 512,256 --repeat 50 --query-repeat 200
    .venv/bin/python bench/model_latency.py --layers 2 --repeat 1  # 开发时：2 层，几秒一轮

- 模型：``XLMRobertaModel``（BGE-M3 的结构与大小：24 层、hidden 1024、16 头、FFN 4096、词表 250002、
  位置编码 8194，另有 M3 的 colbert/sparse 两个头）与它的 ``XLMRobertaForSequenceClassification`` 孪生
  （num_labels=1，bge-reranker-v2-m3 的结构），随机权重，第一次运行时构建并缓存在 ``var/bench-models/``
  （fp32 各约 2.3 GB；构建在子进程里做，本进程的峰值内存只含加载与推理）。构建函数与测试共用
  ``bench/helpers/xlmr_models.py``。
- 加载与计时都经用户会用的那条路径：设置 ``RAG_EMBEDDING_PROVIDER=flag``、``RAG_EMBEDDING_MODEL=<目录>``、
  ``RAG_RERANK_PROVIDER=flag``、``RAG_RERANK_MODEL=<目录>`` 等环境变量后 ``django.setup()``，再用
  ``default_embedder()`` 与 ``get_reranker(rerank_config())``（即 ``configured_reranker()``）——也就是 web 进程里的
  ``GuardedEmbeddingProvider`` / ``GuardedReranker``（断路器、输出检查都在计时内）。重排序结果缓存关掉
  （``RAG_RERANK_CACHE_SIZE=0``），否则重复的请求只测到缓存。cuda 上提供方自己用 fp16。
- 计时：查询 embedding（批大小 1，中英文短查询 10~40 token）；重排序 ``top_k*3 = 15`` 个候选，两种长度：
  ``mixed``（候选 32~480 token 均匀分布，像一个知识库里长短不一的分块）与 ``worst``（每个候选都截满
  max_length）。可扫 ``RAG_RERANK_BATCH_SIZE``（候选按长度降序分批，批越小 padding 越少、并行度越低）与
  ``RAG_RERANK_MAX_LENGTH``（截断）；每个组合各加载一次模型（``get_reranker`` 按配置缓存，与 web 进程相同）。
- 计算下限：每个请求的 FLOPs = 2 x 编码器层参数 x token 数 + 注意力 4 x 层数 x 序列长² x hidden（词向量是
  查表，不计）；按 H100（fp16 dense 989 TFLOPS）、T4（fp16 65 TFLOPS）与本设备实测的矩阵乘吞吐给出理想时间，
  实测延迟除以它就是离计算上限还差几倍。padding 的 token 也要算，单列一行“实际执行的 FLOPs”。
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import resource
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.helpers.xlmr_models import BGE_M3_ARCHITECTURE, build_embedding_model, build_reranker_model  # noqa: E402

MODELS_DIR = ROOT / "var" / "bench-models"
# 标称峰值（TFLOPS，fp16 dense，不含稀疏加速）：H100 SXM 989.5，T4 65
NOMINAL_PEAKS = {"H100 fp16": 989.5e12, "T4 fp16": 65e12}
CANDIDATES = 15  # top_k 默认 5，送进重排序的是 top_k*3 个

# 批大小 1 的查询：中文为主，夹几条英文与中英混排，10~40 个 XLM-R token
QUERIES = (
    "如何在知识库里按标签过滤检索结果？",
    "上传的 PDF 文档一直处于处理中，应该怎么排查？",
    "混合检索的 RRF 融合分数是怎么计算的，为什么不直接相加？",
    "How do I rotate the API key without downtime?",
    "What is the p95 latency of hybrid search at one million chunks?",
    "向量索引 HNSW 的 ef_search 调大以后召回率和延迟分别怎么变化",
    "BGE-M3 embedding 在 GPU 上做 fp16 推理时需要注意什么",
    "重排序服务熔断之后检索结果的分数还可信吗？",
)


@dataclass(frozen=True)
class Stats:
    """一组延迟（毫秒）的摘要；样本少时 p95 接近最大值，须与样本数一起看。"""

    samples: int
    p50_ms: float
    p95_ms: float
    mean_ms: float
    max_ms: float


@dataclass(frozen=True)
class Flops:
    """一个请求的计算量：``ideal`` 只算真实 token，``executed`` 按实际送进模型的（含 padding 的）形状算。"""

    tokens: int
    padded_tokens: int
    ideal: float
    executed: float


# ---------------------------------------------------------------- 模型目录


def _build(kind: str, directory: Path, layers: int) -> None:
    """在子进程里构建：随机初始化 5 亿多参数要占好几 GB 内存，不能算进计时进程的峰值内存。"""
    builder = build_embedding_model if kind == "embedding" else build_reranker_model
    builder(directory, **{**BGE_M3_ARCHITECTURE, "num_hidden_layers": layers})


def model_dir(kind: str, layers: int, models_dir: Path) -> Path:
    """缓存的模型目录；不存在时构建。先写到临时目录再改名，构建中途被打断也不会留下半个模型。"""
    name = "bge-m3" if kind == "embedding" else "bge-reranker-v2-m3"
    directory = models_dir / f"{name}-random-{layers}layers"
    if directory.is_dir():
        return directory
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    print(f"构建 {directory.name}（只在第一次，fp32 约 {1.0 + 1.2 * layers / 24:.1f} GB）…", flush=True)
    started = time.perf_counter()
    process = multiprocessing.get_context("spawn").Process(target=_build, args=(kind, partial, layers))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise SystemExit(f"building {directory.name} failed (exit code {process.exitcode})")
    partial.rename(directory)
    print(f"  用时 {time.perf_counter() - started:.0f} s", flush=True)
    return directory


def parameter_counts(directory: Path) -> tuple[int, int]:
    """（全部参数，编码器各层的参数）；从权重文件头读形状，不加载权重。M3 的两个头也算进全部参数。

    ``save_pretrained`` 在模型超过分片上限时会写成多个 ``model-0000x-of-0000n.safetensors``，所以逐个文件累加。
    """
    import torch
    from safetensors import safe_open

    total = encoder = 0
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118  safe_open 只有 keys()，不能直接迭代
                count = 1
                for size in weights.get_slice(name).get_shape():
                    count *= int(size)
                total += count
                encoder += count if "encoder.layer." in name else 0
    for head in sorted(directory.glob("*_linear.pt")):
        total += sum(t.numel() for t in torch.load(head, map_location="cpu", weights_only=True).values())
    return total, encoder


# ---------------------------------------------------------------- 计量


def peak_rss_mb() -> float:
    """本进程到目前为止的峰值常驻内存（Linux 的 ru_maxrss 单位是 KB）。"""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(call: Callable[[str], Any], repeat: int) -> Stats:
    """``call(query)`` 计时 ``repeat`` 次，查询轮流取 :data:`QUERIES`。"""
    from raglib.evaluation.metrics import percentile

    values = []
    for index in range(repeat):
        query = QUERIES[index % len(QUERIES)]
        started = time.perf_counter()
        call(query)
        values.append((time.perf_counter() - started) * 1000)
    return Stats(samples=len(values), p50_ms=round(percentile(values, 50), 1), p95_ms=round(percentile(values, 95), 1),
                 mean_ms=round(sum(values) / len(values), 1), max_ms=round(max(values), 1))


def request_flops(lengths: Sequence[int], *, batch_size: int, encoder_params: int, layers: int, hidden: int) -> Flops:
    """按提供方的做法（长度降序、每 ``batch_size`` 条一批、批内补齐到最长）估算一个请求的计算量。"""
    def flops(length: int) -> float:
        return 2.0 * encoder_params * length + 4.0 * layers * length * length * hidden

    ordered = sorted(lengths, reverse=True)
    padded = [ordered[start] for start in range(0, len(ordered), batch_size)
              for _ in ordered[start:start + batch_size]]
    return Flops(tokens=sum(lengths), padded_tokens=sum(padded), ideal=sum(flops(n) for n in lengths),
                 executed=sum(flops(n) for n in padded))


def matmul_flops_per_second(device: str) -> tuple[str, float]:
    """本设备上方阵乘法的实测吞吐：CPU 用 fp32（提供方在 CPU 上用 fp32），cuda 用 fp16。取几次里最快的一次。"""
    import torch

    dtype, size, rounds = (torch.float16, 8192, 20) if device.startswith("cuda") else (torch.float32, 2048, 3)
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    best = float("inf")
    for _ in range(rounds + 1):  # 第一次含初始化，不计
        started = time.perf_counter()
        (a @ b).sum().item()
        best = min(best, time.perf_counter() - started)
    label = "fp16" if dtype == torch.float16 else "fp32"
    return f"本设备实测 {label} 矩阵乘", 2.0 * size**3 / best


def device_description(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"{device}: {torch.cuda.get_device_name(device)}（fp16），torch {torch.__version__}"
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (f"cpu: {model}，{os.cpu_count()} 核，torch {torch.__version__} 线程 {torch.get_num_threads()}（fp32），"
            f"1 分钟负载 {os.getloadavg()[0]:.1f}")


# ---------------------------------------------------------------- 输入


def candidate_texts(tokenizer: Any, targets: Sequence[int], seed: int) -> list[str]:
    """用真实句子（见 ``bench/scale_data.real_sentences``）拼出 token 数约为各目标值的候选文本。"""
    from bench.scale_data import real_sentences

    rng = random.Random(seed)
    sentences = real_sentences()
    texts = []
    for target in targets:
        ids: list[int] = []
        while len(ids) < target:
            ids.extend(tokenizer(rng.choice(sentences), add_special_tokens=False)["input_ids"])
        texts.append(tokenizer.decode(ids[:target]))
    return texts


def pair_lengths(tokenizer: Any, query: str, texts: Sequence[str], max_length: int) -> list[int]:
    """query+候选拼接后的 token 数，截断方式与 FlagRerankProvider 相同（only_second）。"""
    encoded = tokenizer([query] * len(texts), list(texts), truncation="only_second", max_length=max_length)
    return [len(ids) for ids in encoded["input_ids"]]


# ---------------------------------------------------------------- 主流程


def configure(args: argparse.Namespace, embedding_dir: Path, reranker_dir: Path) -> None:
    """按用户部署真实模型时的方式设置环境变量，再 ``django.setup()``；这里的值覆盖外部环境（基准的意义所在）。"""
    os.environ.update({
        "HF_HUB_OFFLINE": "1",
        "RAG_EMBEDDING_PROVIDER": "flag",
        "RAG_EMBEDDING_MODEL": str(embedding_dir),
        "RAG_EMBEDDING_DEVICE": args.device,
        "RAG_RERANK_PROVIDER": "flag",
        "RAG_RERANK_MODEL": str(reranker_dir),
        "RAG_RERANK_DEVICE": args.device,
        "RAG_RERANK_BATCH_SIZE": str(args.rerank_batch_sizes[0]),
        "RAG_RERANK_MAX_LENGTH": str(args.rerank_max_lengths[0]),
        "RAG_RERANK_CACHE_SIZE": "0",
    })
    from django_setup import setup_django

    setup_django()


def bench_embedding(args: argparse.Namespace, tokenizer: Any, encoder_params: int, report: dict[str, Any]) -> None:
    from infra.embedders import default_embedder

    started = time.perf_counter()
    embedder = default_embedder()
    report["embedding_load_s"] = round(time.perf_counter() - started, 2)
    report["rss_after_embedding_mb"] = round(peak_rss_mb())
    print(f"embedding：{embedder!r}，加载 {report['embedding_load_s']} s，"
          f"峰值 RSS {report['rss_after_embedding_mb']} MB")

    for query in QUERIES[:2]:  # 预热：首次前向的库初始化、cuda kernel 选择
        embedder.embed_query(query)
    stats = timed(embedder.embed_query, args.query_repeat)
    lengths = [len(ids) for ids in tokenizer(list(QUERIES))["input_ids"]]
    mean_tokens = round(sum(lengths) / len(lengths))
    flops = request_flops([mean_tokens], batch_size=1, encoder_params=encoder_params, layers=args.layers,
                          hidden=BGE_M3_ARCHITECTURE["hidden_size"])
    report["query_embedding"] = {"stats": asdict(stats), "tokens_min_max": [min(lengths), max(lengths)],
                                 "flops": asdict(flops)}
    print(f"查询 embedding（批 1，{min(lengths)}~{max(lengths)} token）：p50 {stats.p50_ms} ms，p95 {stats.p95_ms} ms，"
          f"均值 {stats.mean_ms} ms（{stats.samples} 次）")


def bench_rerank(args: argparse.Namespace, tokenizer: Any, encoder_params: int, report: dict[str, Any]) -> None:
    from raglib.providers.rerank import clear_rerankers, get_reranker
    from search.rerankers import rerank_config

    base = rerank_config()
    assert base is not None  # configure() 设了 RAG_RERANK_PROVIDER=flag
    step = (480 - 32) / (args.candidates - 1) if args.candidates > 1 else 0
    scenarios = {
        "mixed": candidate_texts(tokenizer, [round(32 + step * i) for i in range(args.candidates)], seed=1),
        "worst": candidate_texts(tokenizer, [max(args.rerank_max_lengths) + 16] * args.candidates, seed=2),
    }
    report["rerank"] = []
    for max_length in args.rerank_max_lengths:
        for batch_size in args.rerank_batch_sizes:
            config = replace(base, batch_size=batch_size, max_length=max_length)
            clear_rerankers()  # 放掉上一个组合的模型，内存里只留一份
            reranker = get_reranker(config)
            started = time.perf_counter()
            reranker.warm_up()
            load_s = round(time.perf_counter() - started, 2)
            print(f"重排序 batch_size={batch_size} max_length={max_length}：加载 {load_s} s，"
                  f"峰值 RSS {round(peak_rss_mb())} MB")
            # 每个模型预热一次、不计时（首次前向的库初始化、cuda 上下文）；两个候选就够，CPU 上整批要一分多钟
            reranker.rerank(QUERIES[-1], scenarios["mixed"][:2])
            for name, texts in scenarios.items():
                stats = timed(partial(reranker.rerank, texts=texts), args.repeat)
                lengths = pair_lengths(tokenizer, QUERIES[0], texts, max_length)
                flops = request_flops(lengths, batch_size=batch_size, encoder_params=encoder_params,
                                      layers=args.layers, hidden=BGE_M3_ARCHITECTURE["hidden_size"])
                report["rerank"].append({"scenario": name, "batch_size": batch_size, "max_length": max_length,
                                         "load_s": load_s, "stats": asdict(stats), "flops": asdict(flops)})
                print(f"  {name}（{len(texts)} 个候选，{min(lengths)}~{max(lengths)} token，共 {flops.tokens}，"
                      f"补齐后 {flops.padded_tokens}）：p50 {stats.p50_ms} ms，p95 {stats.p95_ms} ms"
                      f"（{stats.samples} 次）", flush=True)


def print_compute_bound(report: dict[str, Any], measured: tuple[str, float]) -> None:
    """每个计时项：理想时间（FLOPs / 峰值）与实测 p50 之比，即达到了峰值的多少。"""
    peaks = {**NOMINAL_PEAKS, measured[0]: measured[1]}
    print(f"\n计算下限（{measured[0]} {measured[1] / 1e9:.0f} GFLOPS）：")
    rows = [("查询 embedding", report["query_embedding"])] if "query_embedding" in report else []
    rows += [(f"重排序 {r['scenario']} b{r['batch_size']} L{r['max_length']}", r) for r in report.get("rerank", [])]
    for label, row in rows:
        flops, p50 = row["flops"], row["stats"]["p50_ms"]
        ideal = "，".join(f"{name} {_ms(flops['ideal'] / peak * 1000)} ms" for name, peak in peaks.items())
        achieved = flops["executed"] / (p50 / 1000) / measured[1]
        print(f"  {label}：{flops['ideal'] / 1e9:.1f} GFLOP（执行 {flops['executed'] / 1e9:.1f}）；理想时间 {ideal}；"
              f"实测 p50 {p50} ms = 本设备实测峰值的 {achieved:.0%}")


def _ms(value: float) -> str:
    """三位有效数字，大数不用科学计数法。"""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def parse_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="cpu、cuda、cuda:1…；auto 为有 GPU 用 cuda（默认）")
    parser.add_argument("--layers", type=int, default=BGE_M3_ARCHITECTURE["num_hidden_layers"],
                        help="编码器层数（默认 24 = BGE-M3；开发时用 2）")
    parser.add_argument("--query-repeat", type=int, default=40, help="计时的查询 embedding 次数")
    parser.add_argument("--repeat", type=int, default=5, help="每种重排序场景计时的次数（CPU 上 15x512 一次要几十秒）")
    parser.add_argument("--candidates", type=int, default=CANDIDATES, help="每次重排序的候选数（top_k*3）")
    parser.add_argument("--rerank-batch-sizes", type=parse_list, default=[32], help="逗号分隔，如 32,8,4")
    parser.add_argument("--rerank-max-lengths", type=parse_list, default=[512], help="逗号分隔，如 512,256")
    parser.add_argument("--only", choices=("embedding", "rerank"), help="只测其中一项（默认两项都测）")
    parser.add_argument("--models-dir", type=Path, default=MODELS_DIR)
    parser.add_argument("--json", type=Path, help="另把结果写成 JSON（GPU 机器上写到 $OUT 下带回）")
    args = parser.parse_args()

    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    embedding_dir = model_dir("embedding", args.layers, args.models_dir)
    reranker_dir = model_dir("reranker", args.layers, args.models_dir)
    configure(args, embedding_dir, reranker_dir)

    from transformers import AutoTokenizer

    started = time.perf_counter()
    import FlagEmbedding  # noqa: F401  导入本身要几秒，单独计，不算进模型加载

    report: dict[str, Any] = {"device": device_description(args.device), "layers": args.layers,
                              "import_s": round(time.perf_counter() - started, 2)}
    total, encoder = parameter_counts(embedding_dir)
    report["embedding_params"], report["encoder_params"] = total, encoder
    report["reranker_params"] = parameter_counts(reranker_dir)[0]
    print(f"设备 {report['device']}\n参数：embedding {total / 1e6:.1f} M（编码器各层 {encoder / 1e6:.1f} M），"
          f"重排序 {report['reranker_params'] / 1e6:.1f} M；导入 FlagEmbedding {report['import_s']} s")
    tokenizer = AutoTokenizer.from_pretrained(str(embedding_dir))

    if args.only != "rerank":
        bench_embedding(args, tokenizer, encoder, report)
    if args.only != "embedding":
        bench_rerank(args, tokenizer, encoder, report)
    report["peak_rss_mb"] = round(peak_rss_mb())
    if args.device.startswith("cuda"):
        report["cuda_peak_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20)
    print(f"峰值 RSS {report['peak_rss_mb']} MB" + (f"，GPU 峰值显存 {report['cuda_peak_allocated_mb']} MB"
                                                  if "cuda_peak_allocated_mb" in report else ""))
    measured = matmul_flops_per_second(args.device)
    report["measured_flops_per_s"] = measured[1]
    print_compute_bound(report, measured)
    if args.json:
        args.json.write_text(json.dumps(report, ensure_ascii=False, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
