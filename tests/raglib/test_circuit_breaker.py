"""断路器（见 docs/INVARIANTS.md 的 BREAKER-STATES、BREAKER-COUNTS-FAILURES）：状态转换、并发探测、失败判定、指标。
用假时钟，不睡眠。"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from raglib.providers.breaker import BREAKER_STATE, CircuitBreaker, CircuitOpenError
from tests.conftest import FakeClock

ROOT = Path(__file__).resolve().parents[2]


class Boom(Exception):
    pass


def _name() -> str:
    # 指标是进程级全局的：每个断路器用唯一名字，测试之间互不影响
    return f"test:{uuid.uuid4().hex[:12]}"


def _breaker(clock: FakeClock, **kwargs: object) -> CircuitBreaker:
    return CircuitBreaker(_name(), clock=clock, **kwargs)  # type: ignore[arg-type]


def _fail() -> None:
    raise Boom("down")


def _ok() -> str:
    return "ok"


def _fail_n(breaker: CircuitBreaker, n: int) -> None:
    for _ in range(n):
        with pytest.raises(Boom):
            breaker.call(_fail)


def _gauge(name: str) -> float | None:
    return REGISTRY.get_sample_value("circuit_breaker_state", {"name": name})


def _transitions(name: str, to: str) -> float | None:
    return REGISTRY.get_sample_value("circuit_breaker_transitions_total", {"name": name, "to": to})


# ---------------------------------------------------------------- closed


def test_opens_after_exactly_five_consecutive_failures() -> None:
    breaker = _breaker(FakeClock())
    _fail_n(breaker, 4)
    assert breaker.state == "closed"
    assert breaker.failure_count == 4
    _fail_n(breaker, 1)
    assert breaker.state == "open"


def test_success_resets_the_consecutive_count() -> None:
    breaker = _breaker(FakeClock())
    _fail_n(breaker, 4)
    assert breaker.call(_ok) == "ok"
    assert breaker.failure_count == 0
    _fail_n(breaker, 4)
    assert breaker.state == "closed"
    _fail_n(breaker, 1)
    assert breaker.state == "open"


def test_arguments_and_return_value_pass_through() -> None:
    breaker = _breaker(FakeClock())
    assert breaker.call(lambda a, *, b: a + b, 2, b=3) == 5


# ---------------------------------------------------------------- open


def test_open_fails_fast_without_calling_fn() -> None:
    clock = FakeClock()
    breaker = _breaker(clock)
    _fail_n(breaker, 5)
    calls = []
    clock.advance(12.5)
    with pytest.raises(CircuitOpenError) as info:
        breaker.call(lambda: calls.append(1))
    assert calls == []
    assert info.value.name == breaker.name
    assert info.value.retry_after == pytest.approx(17.5)
    assert info.value.transient is True
    assert "retry after 17.5s" in str(info.value)
    assert breaker.retry_after() == pytest.approx(17.5)


def test_single_probe_after_reset_timeout_and_success_closes() -> None:
    clock = FakeClock()
    breaker = _breaker(clock)
    _fail_n(breaker, 5)
    clock.advance(29.999)
    with pytest.raises(CircuitOpenError):
        breaker.call(_ok)
    clock.advance(0.001)
    assert breaker.state == "half_open"
    assert breaker.call(_ok) == "ok"
    assert breaker.state == "closed"
    assert breaker.failure_count == 0
    # 计数真的清零了：还要再连续失败 5 次才会熔断
    _fail_n(breaker, 4)
    assert breaker.state == "closed"


def test_probe_failure_reopens_and_restarts_the_timer_from_the_failure() -> None:
    clock = FakeClock()
    breaker = _breaker(clock)
    _fail_n(breaker, 5)
    clock.advance(30)

    def slow_failing_probe() -> None:
        clock.advance(4)  # 探测本身耗时 4 秒：计时应从失败那一刻算起
        raise Boom("still down")

    with pytest.raises(Boom):
        breaker.call(slow_failing_probe)
    assert breaker.state == "open"
    clock.advance(29.9)
    with pytest.raises(CircuitOpenError) as info:
        breaker.call(_ok)
    assert info.value.retry_after == pytest.approx(0.1)
    clock.advance(0.1)
    assert breaker.call(_ok) == "ok"
    assert breaker.state == "closed"


def test_concurrent_callers_fail_fast_while_the_probe_runs() -> None:
    clock = FakeClock()
    breaker = _breaker(clock)
    _fail_n(breaker, 5)
    clock.advance(30)
    probe_started = threading.Event()
    release_probe = threading.Event()
    probe_result: list[str] = []

    def probe() -> str:
        probe_started.set()
        assert release_probe.wait(10)
        return "probe ok"

    thread = threading.Thread(target=lambda: probe_result.append(breaker.call(probe)))
    thread.start()
    assert probe_started.wait(10)
    others_called = []
    rejected = []
    for _ in range(5):
        try:
            breaker.call(lambda: others_called.append(1))
        except CircuitOpenError as exc:
            rejected.append(exc)
    assert others_called == []
    assert len(rejected) == 5
    assert all(exc.retry_after == 0 for exc in rejected)
    assert "probe call is in progress" in str(rejected[0])
    assert breaker.state == "half_open"
    release_probe.set()
    thread.join(10)
    assert probe_result == ["probe ok"]
    assert breaker.state == "closed"


def test_late_success_from_before_opening_does_not_close() -> None:
    """closed 时发出、熔断之后才返回的调用：它的成功说明不了现在的健康状况，被忽略。"""
    clock = FakeClock()
    breaker = _breaker(clock)
    started = threading.Event()
    release = threading.Event()

    def slow_ok() -> str:
        started.set()
        assert release.wait(10)
        return "late"

    results: list[str] = []
    thread = threading.Thread(target=lambda: results.append(breaker.call(slow_ok)))
    thread.start()
    assert started.wait(10)
    _fail_n(breaker, 5)
    assert breaker.state == "open"
    release.set()
    thread.join(10)
    assert results == ["late"]
    assert breaker.state == "open"


# ---------------------------------------------------------------- 失败判定


def test_is_failure_filter_excludes_input_errors() -> None:
    clock = FakeClock()
    breaker = _breaker(clock, is_failure=lambda exc: not isinstance(exc, ValueError))

    def bad_input() -> None:
        raise ValueError("bad input")

    _fail_n(breaker, 4)
    for _ in range(10):
        with pytest.raises(ValueError):
            breaker.call(bad_input)
    # 不算失败也不算成功：连续失败计数保持 4
    assert breaker.failure_count == 4
    assert breaker.state == "closed"
    _fail_n(breaker, 1)
    assert breaker.state == "open"


def test_uncounted_exception_during_probe_returns_the_probe_slot() -> None:
    clock = FakeClock()
    breaker = _breaker(clock, is_failure=lambda exc: not isinstance(exc, ValueError))
    _fail_n(breaker, 5)
    clock.advance(30)

    def bad_input() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError):
        breaker.call(bad_input)
    assert breaker.state == "half_open"
    assert breaker.call(_ok) == "ok"  # 下一个调用成为新的探测
    assert breaker.state == "closed"


def test_base_exceptions_are_not_failures_by_default() -> None:
    breaker = _breaker(FakeClock(), failure_threshold=1)

    class Interrupted(BaseException):
        pass

    def interrupted() -> None:
        raise Interrupted

    with pytest.raises(Interrupted):
        breaker.call(interrupted)
    assert breaker.state == "closed"


@pytest.mark.parametrize("kwargs", [{"failure_threshold": 0}, {"reset_timeout": -1}])
def test_invalid_parameters_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(_name(), **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- 指标


def test_state_gauge_and_transition_counter() -> None:
    clock = FakeClock()
    breaker = _breaker(clock)
    name = breaker.name
    assert _gauge(name) == 0
    assert _transitions(name, "open") == 0
    _fail_n(breaker, 5)
    assert _gauge(name) == 1
    clock.advance(30)
    assert breaker.state == "half_open"
    assert _gauge(name) == 2
    with pytest.raises(Boom):
        breaker.call(_fail)
    assert _gauge(name) == 1
    clock.advance(30)
    breaker.call(_ok)
    assert _gauge(name) == 0
    assert _transitions(name, "open") == 2
    assert _transitions(name, "half_open") == 2
    assert _transitions(name, "closed") == 1


def test_state_gauge_uses_livemax_in_multiprocess_mode(tmp_path: Path) -> None:
    """PROMETHEUS_MULTIPROC_DIR 下：子进程熔断后，汇总结果里该断路器为 1（livemax 只计存活进程）。"""
    assert BREAKER_STATE._multiprocess_mode == "livemax"
    script = """
import os
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from raglib.providers.breaker import CircuitBreaker

breaker = CircuitBreaker("mp:test", failure_threshold=1)
try:
    breaker.call(lambda: 1 / 0)
except ZeroDivisionError:
    pass
registry = CollectorRegistry()
MultiProcessCollector(registry)
print(registry.get_sample_value("circuit_breaker_state", {"name": "mp:test"}))
print(registry.get_sample_value("circuit_breaker_transitions_total", {"name": "mp:test", "to": "open"}))
"""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    # structlog 未配置时把日志也打到 stdout：只看最后两行
    assert result.stdout.splitlines()[-2:] == ["1.0", "1.0"]
    assert any(p.name.startswith("gauge_livemax_") for p in tmp_path.iterdir())


# ---------------------------------------------------------------- 属性测试

# 一步：("call", 是否成功) 或 ("advance", 秒数)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.booleans()),
        st.tuples(st.just("advance"), st.floats(min_value=0, max_value=45, allow_nan=False)),
    ),
    max_size=60,
)


class ReferenceBreaker:
    """最直白的参考模型，与被测实现独立写成。"""

    def __init__(self, threshold: int, timeout: float) -> None:
        self.threshold = threshold
        self.timeout = timeout
        self.state = "closed"
        self.failures = 0
        self.opened_at = 0.0

    def observe(self, now: float) -> str:
        if self.state == "open" and now - self.opened_at >= self.timeout:
            self.state = "half_open"
        return self.state

    def allows_call(self, now: float) -> bool:
        return self.observe(now) != "open"

    def record(self, success: bool, now: float) -> None:
        if success:
            self.state, self.failures = "closed", 0
        elif self.state == "half_open":
            self.state, self.opened_at = "open", now
        else:
            self.failures += 1
            if self.failures >= self.threshold:
                self.state, self.opened_at = "open", now


@settings(max_examples=300, deadline=None)
@given(
    sequence=steps,
    config=st.sampled_from([(5, 30.0), (3, 20.0), (1, 0.5)]),
    start=st.floats(min_value=0, max_value=1e9, allow_nan=False),
)
def test_breaker_matches_reference_model(sequence: list[tuple[str, object]], config: tuple[int, float],
                                         start: float) -> None:
    """见 docs/INVARIANTS.md 的 BREAKER-STATES（embedding 的 5 次/30 秒与重排序的 3 次/20 秒两种配置）：
    任意调用与时间推进序列下，状态与参考模型一致，
    open 且未到恢复时间时从不调用被保护的函数。"""
    threshold, timeout = config
    clock = FakeClock()
    clock.now = start  # 单调时钟的读数可大可小：剩余时间的计算不能有舍入问题
    breaker = CircuitBreaker(_name(), failure_threshold=threshold, reset_timeout=timeout, clock=clock)
    model = ReferenceBreaker(threshold, timeout)
    for kind, value in sequence:
        if kind == "advance":
            clock.advance(float(value))  # type: ignore[arg-type]
        else:
            success = bool(value)
            called: list[bool] = []

            def fn(success: bool = success, called: list[bool] = called) -> str:
                called.append(True)
                if not success:
                    raise Boom
                return "ok"

            allowed = model.allows_call(clock.now)
            if allowed:
                if success:
                    assert breaker.call(fn) == "ok"
                else:
                    with pytest.raises(Boom):
                        breaker.call(fn)
                model.record(success, clock.now)
                assert called == [True]
            else:
                with pytest.raises(CircuitOpenError) as info:
                    breaker.call(fn)
                assert called == []
                assert 0 < info.value.retry_after <= timeout
        assert breaker.state == model.observe(clock.now)
        if model.state == "closed":
            assert breaker.failure_count == model.failures

