"""断路器：保护 embedding、rerank 等外部或重量级调用。

不变量见 docs/INVARIANTS.md 的 BREAKER-STATES、BREAKER-COUNTS-FAILURES。

状态机：

- ``closed``：正常放行；连续失败计数，任何一次成功清零；连续失败达到阈值即转 ``open``。
- ``open``：不调用被保护的函数，立即抛 :class:`CircuitOpenError`；自打开起满 ``reset_timeout`` 秒后
  转 ``half_open``（惰性转换：在下一次读取状态或调用时发生，没有后台定时器）。
- ``half_open``：只放行恰好一个探测调用，探测进行中的其他调用立即失败；探测成功转 ``closed``
  并清零计数，失败转 ``open`` 并从失败时刻重新计时。

不计入失败的异常（例如调用方的输入错误）由 ``is_failure`` 判定：它们原样抛出，既不算失败也不算
成功——closed 下不改变连续失败计数，half_open 下归还探测名额，让下一个调用再探测。

并发：状态只在持锁时读写，被保护的函数在锁外执行。每次状态转换都会递增 ``_generation``；
调用开始时记下代号，结束时代号已变（例如它在 closed 下发出、返回时断路器已被其他失败打开）
就忽略它的结果，避免迟到的成功把刚打开的断路器关掉，或迟到的失败重启恢复计时。
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal, ParamSpec, Protocol, TypeVar

import structlog
from prometheus_client import Counter, Gauge

logger = structlog.get_logger(__name__)

State = Literal["closed", "open", "half_open"]
STATES: tuple[State, ...] = ("closed", "open", "half_open")
# 指标里的数值编码：0 closed，1 open，2 half_open
STATE_VALUES: dict[State, int] = {"closed": 0, "open": 1, "half_open": 2}

# livemax：多进程（PROMETHEUS_MULTIPROC_DIR）下取存活进程中的最大值——任一进程熔断即可见；
# 进程退出后它的取值不再参与汇总。
BREAKER_STATE = Gauge(
    "circuit_breaker_state",
    "断路器状态：0 closed，1 open，2 half_open",
    ["name"],
    multiprocess_mode="livemax",
)
BREAKER_TRANSITIONS = Counter(
    "circuit_breaker_transitions_total",
    "断路器状态转换次数（to 为转换后的状态）",
    ["name", "to"],
)

P = ParamSpec("P")
T = TypeVar("T")


def count_every_exception(exc: BaseException) -> bool:
    """默认判定：所有 ``Exception`` 都算失败；``KeyboardInterrupt`` 等 ``BaseException`` 不算。"""
    return isinstance(exc, Exception)


class CircuitOpenError(Exception):
    """断路器拒绝了调用（open，或 half_open 时已有探测在进行）；调用方应视为暂时性错误。"""

    # 与 EmbeddingError.transient 同名，调用方可统一按 ``getattr(exc, "transient", False)`` 处理
    transient = True

    def __init__(self, name: str, retry_after: float) -> None:
        self.name = name
        # 距离下一次允许探测还有多少秒；0 表示探测正在进行，结果未知
        self.retry_after = max(0.0, retry_after)
        if self.retry_after > 0:
            message = f"circuit breaker {name!r} is open, retry after {self.retry_after:.1f}s"
        else:
            message = f"circuit breaker {name!r} is half-open and a probe call is in progress"
        super().__init__(message)


class CircuitBreaker:
    """线程安全的断路器；``call(fn, *args, **kwargs)`` 经它执行被保护的函数。"""

    def __init__(
        self,
        name: str,
        *,
        failure_threshold: int = 5,
        reset_timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        is_failure: Callable[[BaseException], bool] = count_every_exception,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        if reset_timeout < 0:
            raise ValueError("reset_timeout must be >= 0")
        self.name = name
        self.failure_threshold = failure_threshold
        self.reset_timeout = reset_timeout
        self._clock = clock
        self._is_failure = is_failure
        self._lock = threading.Lock()
        self._state: State = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._probe_in_flight = False
        self._generation = 0
        BREAKER_STATE.labels(name=name).set(STATE_VALUES["closed"])
        # 预先创建各个 to 标签，从未发生的转换也以 0 出现
        for to in STATES:
            BREAKER_TRANSITIONS.labels(name=name, to=to)

    # ------------------------------------------------------------ 只读视图

    @property
    def state(self) -> State:
        """当前状态；open 已满 ``reset_timeout`` 时读取即转为 half_open。"""
        with self._lock:
            self._maybe_half_open()
            return self._state

    @property
    def failure_count(self) -> int:
        """closed 状态下当前的连续失败次数。"""
        with self._lock:
            return self._failures

    def retry_after(self) -> float:
        """open 时距离允许探测还有多少秒；其他状态为 0。"""
        with self._lock:
            self._maybe_half_open()
            return self._remaining() if self._state == "open" else 0.0

    # ------------------------------------------------------------ 调用

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """经断路器调用 ``fn``；被拒绝时抛 :class:`CircuitOpenError`，``fn`` 的异常原样抛出。"""
        generation, is_probe = self._acquire()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._on_exception(generation, is_probe, exc)
            raise
        self._on_success(generation)
        return result

    def _acquire(self) -> tuple[int, bool]:
        """决定放行与否；放行时返回（当前代号，是否为探测调用）。"""
        with self._lock:
            self._maybe_half_open()
            if self._state == "closed":
                return self._generation, False
            if self._state == "open":
                raise CircuitOpenError(self.name, self._remaining())
            if self._probe_in_flight:
                raise CircuitOpenError(self.name, 0.0)
            self._probe_in_flight = True
            return self._generation, True

    def _on_success(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return  # 迟到的结果：断路器已换了状态
            if self._state == "half_open":
                self._transition("closed")
            else:
                self._failures = 0

    def _on_exception(self, generation: int, is_probe: bool, exc: BaseException) -> None:
        with self._lock:
            if generation != self._generation:
                return
            counted = self._is_failure(exc)
            if self._state == "half_open":
                if counted:
                    self._transition("open")
                elif is_probe:
                    # 探测没有给出服务健康与否的信息（如输入错误），把名额还回去
                    self._probe_in_flight = False
                return
            if counted:
                self._failures += 1
                if self._failures >= self.failure_threshold:
                    self._transition("open")

    # ------------------------------------------------------------ 内部：须持锁调用

    def _maybe_half_open(self) -> None:
        if self._state == "open" and self._remaining() <= 0:
            self._transition("half_open")

    def _remaining(self) -> float:
        # 写成 timeout - 已过时间，而不是 opened_at + timeout - now：时钟读数很大时后者有舍入误差，
        # 会算出略大于 reset_timeout 的剩余时间；前者与“是否已到时”的判断用的是同一个量
        return self.reset_timeout - (self._clock() - self._opened_at)

    def _transition(self, to: State) -> None:
        previous = self._state
        self._state = to
        self._generation += 1
        self._probe_in_flight = False
        if to == "open":
            # 打开（含探测失败后重新打开）时从此刻重新计时
            self._opened_at = self._clock()
        if to == "closed":
            self._failures = 0
        BREAKER_STATE.labels(name=self.name).set(STATE_VALUES[to])
        BREAKER_TRANSITIONS.labels(name=self.name, to=to).inc()
        log = logger.warning if to == "open" else logger.info
        log("circuit_breaker_state_changed", breaker=self.name, from_state=previous, to_state=to,
            failures=self._failures, reset_timeout=self.reset_timeout)

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.name!r}, state={self._state!r}, failures={self._failures})"


class BreakerSettings(Protocol):
    """提供方配置里与断路器有关的部分（:class:`~raglib.providers.embedding.EmbeddingConfig`、
    :class:`~raglib.providers.rerank.RerankConfig` 都满足）。"""

    @property
    def breaker_name(self) -> str: ...

    @property
    def failure_threshold(self) -> int: ...

    @property
    def reset_timeout(self) -> float: ...


class BreakerRegistry:
    """按名字共享的断路器：同一个 ``provider:model`` 只有一个状态（与指标的 name 标签一一对应）。

    断路器在模型加载失败后也留在这里，所以反复加载失败同样会熔断。阈值与恢复时间取第一次创建时的配置。
    """

    def __init__(self) -> None:
        self._breakers: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()

    def get(self, name: str, *, failure_threshold: int, reset_timeout: float,
            is_failure: Callable[[BaseException], bool]) -> CircuitBreaker:
        with self._lock:
            breaker = self._breakers.get(name)
            if breaker is None:
                breaker = CircuitBreaker(name, failure_threshold=failure_threshold, reset_timeout=reset_timeout,
                                         is_failure=is_failure)
                self._breakers[name] = breaker
            return breaker

    def for_config(self, config: BreakerSettings, *, is_failure: Callable[[BaseException], bool]) -> CircuitBreaker:
        """该配置对应的断路器（不存在则按配置的阈值与恢复时间创建）。"""
        return self.get(config.breaker_name, failure_threshold=config.failure_threshold,
                        reset_timeout=config.reset_timeout, is_failure=is_failure)

    def clear(self) -> None:
        with self._lock:
            self._breakers.clear()
