"""端到端检索基准（``bench/e2e_search.py``）里不碰网络与数据库的部分：解析 ``Server-Timing``、算分位数与服务开销、
汇总 py-spy 的采样。单独成模块，测试可以直接导入（``tests/bench/test_e2e_report.py``）。"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from raglib.evaluation.metrics import percentile

# 模型时间的阶段：服务开销 = 端到端 - 这些阶段之和（issue #11 第 5 项的定义，目标 p95 ≤ 15 ms）
MODEL_STAGES = ("embed", "rerank")
# 采样栈里出现这些路径的帧即算模型时间（embedding 与重排序的提供方都在这里，模型库的帧在它们之下）
MODEL_PATHS = ("raglib/providers/",)
# 处理请求的栈：gthread 的请求线程，以及检索向量路的线程池（search.services._in_worker）。
# 其余样本是等连接、等任务的空闲线程与 gunicorn 的主循环，不进排行
REQUEST_FRAMES = ("ThreadWorker.handle (gunicorn/workers/gthread.py)", "_in_worker (search/services.py)")
# 累计时间排行略去“直通”的帧：样本几乎全部（这个比例以上）落在同一个被调函数里。线程、WSGI、中间件这串
# 每个请求都要经过的外壳都是直通的，累计时间又都接近 100%，排在前面只会挤掉有信息的分叉点
PASS_THROUGH = 0.95
# 路径里这些标记之后的部分才有用：第三方包与标准库只留包内路径
_PATH_MARKERS = ("/site-packages/", "/lib/python3.11/")
_FRAME = re.compile(r"^(?P<function>.*) \((?P<path>.*?)(?::\d+)?\)$")


def parse_server_timing(header: str) -> dict[str, float]:
    """``embed;dur=12.3, vector;desc="x";dur=4.0`` → ``{"embed": 12.3, "vector": 4.0}``；没有 ``dur`` 的项跳过。"""
    timings: dict[str, float] = {}
    for metric in header.split(","):
        name, *params = (part.strip() for part in metric.split(";"))
        for param in params:
            key, _, value = param.partition("=")
            if name and key.strip() == "dur":
                timings[name] = float(value)
    return timings


@dataclass(frozen=True)
class Sample:
    """一次请求：客户端测得的端到端毫秒数，与响应头里服务端的分阶段毫秒数。"""

    e2e_ms: float
    stages: dict[str, float]

    @property
    def overhead_ms(self) -> float:
        """服务开销：端到端减去模型时间（HTTP、gunicorn、中间件、鉴权、SQL、融合、序列化……）。"""
        return self.e2e_ms - sum(self.stages.get(stage, 0.0) for stage in MODEL_STAGES)


@dataclass(frozen=True)
class Summary:
    """一种检索方式的汇总（毫秒）。``stages`` 的分位只算报告了该阶段的请求，按首次出现的顺序。"""

    count: int
    e2e: tuple[float, float, float]  # p50, p95, p99
    overhead: tuple[float, float, float]
    stages: dict[str, tuple[float, float]]  # 阶段 → (p50, p95)


def _p50_95_99(values: Sequence[float]) -> tuple[float, float, float]:
    return percentile(values, 50), percentile(values, 95), percentile(values, 99)


def summarize(samples: Sequence[Sample]) -> Summary:
    by_stage: dict[str, list[float]] = {}
    for sample in samples:
        for stage, ms in sample.stages.items():
            by_stage.setdefault(stage, []).append(ms)
    return Summary(
        count=len(samples),
        e2e=_p50_95_99([s.e2e_ms for s in samples]),
        overhead=_p50_95_99([s.overhead_ms for s in samples]),
        stages={stage: (percentile(values, 50), percentile(values, 95)) for stage, values in by_stage.items()},
    )


def frame_name(frame: str, root: str) -> str:
    """``search (/srv/app/search/services.py:199)`` → ``search (search/services.py)``：去掉行号，同一函数的样本
    才合得到一起；路径去掉项目根目录、site-packages 或标准库目录之前的部分。"""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match["path"]
    for marker in _PATH_MARKERS:
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = path.removeprefix(root.rstrip("/") + "/")
    return f"{match['function']} ({path})"


@dataclass
class Profile:
    """py-spy 采样的汇总。只有处理请求的栈进排行：``own`` 是栈顶（函数自身）的样本数，``total`` 是出现在栈里
    任何位置的样本数；请求里落在模型中的样本只计入 ``model_samples``（服务开销里没有它们）。"""

    samples: int = 0
    request_samples: int = 0
    model_samples: int = 0
    own: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)  # (调用者, 被调者) → 样本数

    @property
    def ranked_samples(self) -> int:
        """进排行的样本：请求里、模型之外。"""
        return self.request_samples - self.model_samples

    def add_raw(self, lines: Iterable[str], *, root: str) -> None:
        """累加 ``py-spy record --format raw`` 的输出：每行 ``帧;帧;…;栈顶帧 样本数``。"""
        for line in lines:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = [frame_name(frame, root) for frame in stack.split(";")]
            samples = int(count)
            self.samples += samples
            if not any(frame in REQUEST_FRAMES for frame in frames):
                continue
            self.request_samples += samples
            if any(marker in frame for frame in frames for marker in MODEL_PATHS):
                self.model_samples += samples
                continue
            self.own[frames[-1]] += samples
            for frame in set(frames):
                self.total[frame] += samples
            for call in set(pairwise(frames)):
                self.calls[call] += samples

    def top_own(self, count: int) -> list[tuple[str, int, float]]:
        """自身时间最多的 ``count`` 个帧：(帧, 样本数, 占排行样本的百分比)。"""
        return self._percent(self.own.most_common(count))

    def top_total(self, count: int) -> list[tuple[str, int, float]]:
        """累计时间最多的 ``count`` 个帧，略去直通的帧（见 :data:`PASS_THROUGH`）。"""
        widest: Counter[str] = Counter()
        for (caller, _), samples in self.calls.items():
            widest[caller] = max(widest[caller], samples)
        rows = [(frame, n) for frame, n in self.total.most_common() if widest[frame] < PASS_THROUGH * n]
        return self._percent(rows[:count])

    def _percent(self, rows: list[tuple[str, int]]) -> list[tuple[str, int, float]]:
        ranked = max(self.ranked_samples, 1)
        return [(frame, n, n * 100 / ranked) for frame, n in rows]
