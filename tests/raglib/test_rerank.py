"""重排序：真实的 FlagReranker 加载器（极小随机模型）、本地起的 HTTP 服务（TEI 与 Cohere 两种接口）、
保护层（缓存、重试、断路器）、注册表与指标。不访问网络，不需要数据库。

对应 docs/INVARIANTS.md 的 RERANK-ORDER、BREAKER-STATES、BREAKER-COUNTS-FAILURES、RERANK-CACHE、SCORE-RANGE。"""

from __future__ import annotations

import itertools
import math
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from raglib.providers import rerank as rerank_module
from raglib.providers.breaker import CircuitBreaker, CircuitOpenError
from raglib.providers.rerank import (
    RERANK_CACHE_HIT_RATE,
    RETRY_BACKOFF,
    FlagRerankProvider,
    GuardedReranker,
    RerankConfig,
    RerankError,
    RerankUnavailable,
    candidates_digest,
    clear_rerankers,
    counts_as_failure,
    get_reranker,
    loaded_rerank_models,
    register_rerank_provider,
    rerank_cache_hit_rate,
    sigmoid,
)
from search.rerankers import configured_reranker, rerank_config
from tests.conftest import FakeClock
from tests.fake_http import FakeJsonServer
from tests.model_fixtures import tiny_reranker_model_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_rerankers() -> Iterator[None]:
    """每个测试从空的实例缓存、新断路器、清零的命中率统计开始。"""
    clear_rerankers()
    yield
    clear_rerankers()


class FakeProvider:
    """可编排输出与失败的假提供方：``errors`` 里的异常依次抛出，用完后返回 ``raw``（或按长度算的分数）。"""

    provider = "fake"
    model = "fake-model"

    def __init__(self, *, probabilities: bool = False) -> None:
        self.scores_are_probabilities = probabilities
        self.errors: list[BaseException] = []
        self.raw: list[float] | None = None
        self.calls = 0

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        if self.raw is not None:
            return list(self.raw)
        return [float(len(text) - len(query)) for text in texts]


def _guarded(fake: FakeProvider, *, clock: FakeClock | None = None, sleeps: list[float] | None = None,
             **overrides: Any) -> GuardedReranker:
    """直接构造保护层：唯一的断路器名（指标按名字区分）、可注入的时钟与 sleep。"""
    clock = clock or FakeClock()
    values: dict[str, Any] = {"provider": "fake", "model": f"m-{uuid.uuid4().hex[:10]}"}
    values.update(overrides)
    config = RerankConfig(**values)
    breaker = CircuitBreaker(config.breaker_name, failure_threshold=config.failure_threshold,
                             reset_timeout=config.reset_timeout, clock=clock, is_failure=counts_as_failure)
    recorded = sleeps if sleeps is not None else []
    return GuardedReranker(config, lambda: fake, breaker=breaker, sleep=recorded.append, timer=clock)


# ---------------------------------------------------------------- sigmoid 与缓存键


def test_sigmoid_is_stable_for_huge_and_infinite_inputs() -> None:
    assert sigmoid(0.0) == 0.5
    assert sigmoid(1e308) == 1.0 and sigmoid(-1e308) == 0.0
    assert sigmoid(math.inf) == 1.0 and sigmoid(-math.inf) == 0.0
    assert sigmoid(-800.0) == 0.0  # 直接写 1/(1+exp(800)) 会 OverflowError
    assert sigmoid(2.0) == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert sigmoid(-2.0) == pytest.approx(1 - sigmoid(2.0))


def test_candidates_digest_depends_on_order_and_boundaries() -> None:
    assert candidates_digest(["ab", "c"]) != candidates_digest(["a", "bc"])
    assert candidates_digest(["a", "b"]) != candidates_digest(["b", "a"])
    assert candidates_digest(["a", "b"]) == candidates_digest(("a", "b"))
    assert candidates_digest(["\ud800"])  # 孤立的代理码点也能编码


# ---------------------------------------------------------------- flag（真实 FlagReranker 加载器）

QUERY = "中国的首都是哪里"
CANDIDATES = [
    "北京是中华人民共和国的首都。",
    "这款洗衣机的滚筒容量是十公斤，支持蒸汽除菌。",
    "短",
    "又一段较长的文本：" + "检索增强生成" * 40,  # 超过 max_length，走截断
    "",
    "Mixed 中英 text with some English words.",
]


@pytest.fixture(scope="module")
def flag_config(tiny_reranker_model_dir: Path) -> RerankConfig:  # noqa: F811
    # batch_size=2：六个候选分三批；max_length=48：长候选被截断
    return RerankConfig(provider="flag", model=str(tiny_reranker_model_dir), device="cpu", batch_size=2,
                        max_length=48)


@pytest.fixture(scope="module")
def flag_provider(flag_config: RerankConfig) -> FlagRerankProvider:
    return FlagRerankProvider(flag_config)


def test_flag_matches_flag_reranker_compute_score(flag_provider: FlagRerankProvider,
                                                  flag_config: RerankConfig) -> None:
    """我们绕开 compute_score 自己分批推理：原始分数与 sigmoid 后的分数都须与它一致（升级 FlagEmbedding 的护栏）。"""
    from FlagEmbedding import FlagReranker

    reference = FlagReranker(flag_config.model, use_fp16=False, devices="cpu")
    pairs = [[QUERY, text] for text in CANDIDATES]
    expected_raw = reference.compute_score(pairs, batch_size=2, max_length=48, normalize=False)
    raw = flag_provider.score(QUERY, CANDIDATES)
    assert len(raw) == len(CANDIDATES)
    assert all(math.isfinite(s) for s in raw)
    assert raw == pytest.approx(expected_raw, abs=1e-5)
    # 随机权重也给出彼此不同的分数：确认不是每个候选都一样
    assert len({round(s, 6) for s in raw}) > 1

    long_query = "很长的查询" * 30  # query 自己也超过 max_length*3/4，被截断
    expected_long = reference.compute_score([[long_query, t] for t in CANDIDATES], batch_size=2, max_length=48,
                                            normalize=False)
    assert flag_provider.score(long_query, CANDIDATES) == pytest.approx(expected_long, abs=1e-5)

    guarded = GuardedReranker(flag_config, lambda: flag_provider, breaker=CircuitBreaker("test:flag-guarded"))
    expected_sigmoid = reference.compute_score(pairs, batch_size=2, max_length=48, normalize=True)
    scores = guarded.rerank(QUERY, CANDIDATES)
    assert scores == pytest.approx(expected_sigmoid, abs=1e-5)
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_flag_keeps_input_order(flag_provider: FlagRerankProvider) -> None:
    forward = flag_provider.score(QUERY, CANDIDATES)
    backward = flag_provider.score(QUERY, CANDIDATES[::-1])
    assert backward[::-1] == pytest.approx(forward, abs=1e-5)
    alone = [flag_provider.score(QUERY, [text])[0] for text in CANDIDATES]
    assert alone == pytest.approx(forward, abs=1e-5)
    assert flag_provider.score(QUERY, []) == []


def test_flag_runs_one_forward_pass_per_batch(flag_provider: FlagRerankProvider) -> None:
    """compute_score 会先把第一批前向一遍“试批大小”再从头算；我们每批只算一次。"""
    calls: list[int] = []
    handle = flag_provider._network.register_forward_hook(lambda *args: calls.append(1))
    try:
        flag_provider.score(QUERY, CANDIDATES[:5])
    finally:
        handle.remove()
    assert len(calls) == 3  # 5 个候选，批大小 2


def test_flag_clamps_max_length_to_model_positions(tiny_reranker_model_dir: Path) -> None:  # noqa: F811
    provider = FlagRerankProvider(RerankConfig(provider="flag", model=str(tiny_reranker_model_dir), device="cpu",
                                               max_length=4096))
    assert provider.max_length == 512  # 极小模型 max_position_embeddings=514
    scores = provider.score(QUERY, ["长" * 2000])
    assert math.isfinite(scores[0])


def test_flag_is_loaded_once_lazily_through_the_registry(flag_config: RerankConfig,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import FlagEmbedding

    created: list[int] = []
    original = FlagEmbedding.FlagReranker

    def counting(*args: Any, **kwargs: Any) -> Any:
        created.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(FlagEmbedding, "FlagReranker", counting)
    reranker = get_reranker(flag_config)
    assert created == [] and loaded_rerank_models() == []  # 取实例不加载模型
    for query in ("一", "二", "三"):
        scores = reranker.rerank(query, CANDIDATES)
        assert len(scores) == len(CANDIDATES) and all(0.0 <= s <= 1.0 for s in scores)
    assert get_reranker(flag_config) is reranker
    assert created == [1]
    assert loaded_rerank_models() == [{"provider": "flag", "model": flag_config.model}]


def test_flag_missing_model_opens_the_breaker_instead_of_reloading(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import FlagEmbedding

    attempts: list[int] = []
    original = FlagEmbedding.FlagReranker

    def counting(*args: Any, **kwargs: Any) -> Any:
        attempts.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(FlagEmbedding, "FlagReranker", counting)
    reranker = get_reranker(RerankConfig(provider="flag", model=str(tmp_path / "no-such-model"), device="cpu"))
    for _ in range(3):
        with pytest.raises(RerankUnavailable, match="could not load rerank model flag:"):
            reranker.rerank("q", ["a"])
    assert attempts == [1, 1, 1]  # 加载失败不重试（不是暂时性错误）
    assert reranker.breaker.state == "open"
    for _ in range(5):
        with pytest.raises(RerankUnavailable) as info:
            reranker.rerank("q", ["a"])
        assert isinstance(info.value.__cause__, CircuitOpenError)
        assert info.value.retry_after is not None and info.value.retry_after > 0
    assert attempts == [1, 1, 1]
    assert loaded_rerank_models() == []


# ---------------------------------------------------------------- http（本地起的假服务）


def fake_logit(query: str, text: str) -> float:
    """确定性的假 logit（可正可负，测试客户端是否做 sigmoid）。"""
    return float(len(text) - len(query)) * 0.75


def fake_relevance(text: str) -> float:
    """确定性的假相关度，已在 (0, 1]。"""
    return 1.0 / (1.0 + len(text))


class FakeRerankServer(FakeJsonServer):
    """127.0.0.1 上的 TEI（/rerank）+ Cohere（/v1/rerank）重排序服务；可注入错误，记录每个请求。"""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[int] = []  # 依次用于接下来的请求；用完后正常应答
        self.fail_status: int | None = None  # 设置后所有请求都返回该状态码
        self.fail_body: Any = {"error": "boom"}
        self.override: Any = None  # 设置后 200 应答这个正文（畸形响应测试）

    def claim(self, path: str, body: Any) -> int | None:
        """与记录请求在同一把锁内取走本次请求的状态码（statuses 依次用完后是 fail_status）。"""
        return self.statuses.pop(0) if self.statuses else self.fail_status

    def respond(self, path: str, body: Any, claimed: Any) -> tuple[int, Any]:
        if claimed is not None:
            return claimed, self.fail_body
        if self.override is not None:
            return 200, self.override
        if path == "/rerank":
            ranked = [{"index": i, "score": fake_logit(body["query"], t)} for i, t in enumerate(body["texts"])]
            # TEI 按分数降序返回：与输入顺序不同
            return 200, sorted(ranked, key=lambda r: -r["score"])
        if path == "/v1/rerank":
            results = [{"index": i, "relevance_score": fake_relevance(t)} for i, t in enumerate(body["documents"])]
            results.reverse()
            return 200, {"id": "x", "results": results[:body["top_n"]]}
        return 404, {"error": "Not Found"}

    def reranker(self, sleeps: list[float] | None = None, **overrides: Any) -> GuardedReranker:
        """经真实的注册表与 http 工厂构造，只把断路器与 sleep 换成测试可控的。"""
        values: dict[str, Any] = {"provider": "http", "model": f"fake-rerank-{uuid.uuid4().hex[:8]}",
                                  "url": self.url, "timeout": 5.0}
        values.update(overrides)
        config = RerankConfig(**values)
        real = get_reranker(config)
        recorded = sleeps if sleeps is not None else []
        return GuardedReranker(config, real._load, breaker=real.breaker, sleep=recorded.append)


@pytest.fixture
def fake_server() -> Iterator[FakeRerankServer]:
    with FakeRerankServer() as server:
        yield server


TEXTS = ["甲", "乙乙乙乙", "丙丙", "丁丁丁丁丁丁", "戊"]


def test_http_tei_request_shape_auth_and_out_of_order_indices(fake_server: FakeRerankServer) -> None:
    reranker = fake_server.reranker(api="tei", api_key="sk-test", batch_size=2)
    scores = reranker.rerank("查询", TEXTS)
    assert scores == pytest.approx([sigmoid(fake_logit("查询", t)) for t in TEXTS])
    assert [r["path"] for r in fake_server.requests] == ["/rerank"] * 3
    assert [r["body"] for r in fake_server.requests] == [
        {"query": "查询", "texts": batch, "raw_scores": True, "truncate": True}
        for batch in (TEXTS[0:2], TEXTS[2:4], TEXTS[4:5])
    ]
    assert all(r["authorization"] == "Bearer sk-test" for r in fake_server.requests)


def test_http_cohere_request_shape_and_no_second_sigmoid(fake_server: FakeRerankServer) -> None:
    reranker = fake_server.reranker(api="cohere", model="jina-reranker-v2", batch_size=32)
    scores = reranker.rerank("查询", TEXTS)
    # relevance_score 已是 0..1：原样返回，不再经 sigmoid（否则都会落在 0.5..0.73）
    assert scores == [fake_relevance(t) for t in TEXTS]
    assert len(fake_server.requests) == 1
    request = fake_server.requests[0]
    assert request["path"] == "/v1/rerank"
    assert request["body"] == {"model": "jina-reranker-v2", "query": "查询", "documents": TEXTS, "top_n": len(TEXTS)}
    assert request["authorization"] is None


def test_http_cohere_base_url_may_end_with_v1(fake_server: FakeRerankServer) -> None:
    reranker = fake_server.reranker(api="cohere", url=fake_server.url + "/v1/")
    reranker.rerank("q", ["a"])
    assert [r["path"] for r in fake_server.requests] == ["/v1/rerank"]


def test_http_5xx_is_retried_twice_then_fails_and_counts_once(fake_server: FakeRerankServer) -> None:
    sleeps: list[float] = []
    reranker = fake_server.reranker(sleeps=sleeps)
    fake_server.fail_status, fake_server.fail_body = 503, {"error": "model is overloaded"}
    with pytest.raises(RerankUnavailable, match="model is overloaded") as info:
        reranker.rerank("q", ["a", "b"])
    assert fake_server.count == 3  # 首次 + 2 次重试
    assert sleeps == list(RETRY_BACKOFF)
    cause = info.value.__cause__
    assert isinstance(cause, RerankError) and (cause.transient, cause.status) == (True, 503)
    assert reranker.breaker.failure_count == 1  # 一个请求只记一次失败


def test_http_transient_failure_then_success(fake_server: FakeRerankServer) -> None:
    sleeps: list[float] = []
    reranker = fake_server.reranker(sleeps=sleeps)
    fake_server.statuses = [502]
    assert reranker.rerank("q", ["a"]) == [pytest.approx(sigmoid(fake_logit("q", "a")))]
    assert fake_server.count == 2
    assert sleeps == [RETRY_BACKOFF[0]]
    assert reranker.breaker.failure_count == 0


@pytest.mark.parametrize("status", [408, 429])
def test_http_408_and_429_are_retried(fake_server: FakeRerankServer, status: int) -> None:
    reranker = fake_server.reranker()
    fake_server.statuses = [status, status]
    assert len(reranker.rerank("q", ["a"])) == 1
    assert fake_server.count == 3


def test_http_4xx_is_not_retried(fake_server: FakeRerankServer) -> None:
    sleeps: list[float] = []
    reranker = fake_server.reranker(sleeps=sleeps)
    fake_server.fail_status, fake_server.fail_body = 401, {"message": "invalid api key"}
    with pytest.raises(RerankUnavailable, match="invalid api key") as info:
        reranker.rerank("q", ["a"])
    assert fake_server.count == 1 and sleeps == []
    assert isinstance(info.value.__cause__, RerankError) and info.value.__cause__.status == 401
    assert reranker.breaker.failure_count == 1  # 配错 key 是服务不可用：计入断路器


def test_http_input_rejected_is_not_retried_nor_counted(fake_server: FakeRerankServer) -> None:
    reranker = fake_server.reranker()
    fake_server.fail_status = 413
    for _ in range(5):
        with pytest.raises(RerankUnavailable):
            reranker.rerank("q", ["a"])
    assert fake_server.count == 5
    assert reranker.breaker.failure_count == 0 and reranker.breaker.state == "closed"


@pytest.mark.parametrize("api, body, message", [
    ("tei", [{"index": 0, "score": 1.0}], "1 results for 2 texts"),
    ("tei", {"error": "not a list"}, "a dict for 2 texts"),
    ("tei", [{"index": 0, "score": 1.0}, {"score": 2.0}], "index"),
    ("tei", [{"index": 0, "score": 1.0}, {"index": 0, "score": 2.0}], "duplicate"),
    ("tei", [{"index": 0, "score": 1.0}, {"index": 2, "score": 2.0}], "out-of-range"),
    ("tei", [{"index": 0, "score": 1.0}, {"index": True, "score": 2.0}], "index"),
    ("tei", [{"index": 0, "score": 1.0}, {"index": 1, "score": "high"}], "numeric 'score'"),
    ("cohere", {"results": [{"index": 1, "relevance_score": 0.5}, {"index": 0}]}, "numeric 'relevance_score'"),
    ("cohere", [{"index": 0, "relevance_score": 0.5}], "a NoneType for 2 texts"),
])
def test_http_malformed_responses_fail_without_retry(fake_server: FakeRerankServer, api: str, body: Any,
                                                     message: str) -> None:
    reranker = fake_server.reranker(api=api)
    fake_server.override = body
    with pytest.raises(RerankUnavailable, match=message):
        reranker.rerank("q", ["a", "b"])
    assert fake_server.count == 1
    assert reranker.breaker.failure_count == 1


def test_http_timeout_is_transient_and_retried(fake_server: FakeRerankServer) -> None:
    reranker = fake_server.reranker(timeout=0.2)
    fake_server.delay = 0.6
    with pytest.raises(RerankUnavailable, match="timed out"):
        reranker.rerank("q", ["a"])
    assert fake_server.count == 3


def test_http_unreachable_server_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sleeps: list[float] = []
    config = RerankConfig(provider="http", model="m-unreachable", url=f"http://127.0.0.1:{port}", timeout=2.0)
    real = get_reranker(config)
    reranker = GuardedReranker(config, real._load, breaker=real.breaker, sleep=sleeps.append)
    with pytest.raises(RerankUnavailable, match="unreachable"):
        reranker.rerank("q", ["a"])
    assert len(sleeps) == 2


def test_http_without_url_is_a_load_failure() -> None:
    reranker = get_reranker(RerankConfig(provider="http", model="m"))
    with pytest.raises(RerankUnavailable, match="needs a url"):
        reranker.rerank("q", ["a"])
    assert reranker.breaker.failure_count == 1


# ---------------------------------------------------------------- 保护层


def test_empty_candidates_return_empty_without_any_call() -> None:
    provider = FakeProvider()
    reranker = _guarded(provider)
    before = REGISTRY.get_sample_value("rerank_cache_requests_total", {"result": "miss"})
    assert reranker.rerank("q", []) == []
    assert provider.calls == 0 and not reranker.loaded
    assert REGISTRY.get_sample_value("rerank_cache_requests_total", {"result": "miss"}) == before


def test_caller_errors_are_type_errors_and_bypass_the_breaker() -> None:
    provider = FakeProvider()
    reranker = _guarded(provider)
    with pytest.raises(TypeError):
        reranker.rerank("q", "a single string")
    with pytest.raises(TypeError):
        reranker.rerank("q", ["ok", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        reranker.rerank(None, ["a"])  # type: ignore[arg-type]
    assert provider.calls == 0 and reranker.breaker.failure_count == 0


def test_local_model_errors_are_not_retried_but_counted() -> None:
    provider = FakeProvider()
    provider.errors = [RuntimeError("CUDA error: device-side assert")]
    sleeps: list[float] = []
    reranker = _guarded(provider, sleeps=sleeps)
    with pytest.raises(RerankUnavailable, match="CUDA error") as info:
        reranker.rerank("q", ["a"])
    assert isinstance(info.value.__cause__, RuntimeError)
    assert provider.calls == 1 and sleeps == []
    assert reranker.breaker.failure_count == 1


@pytest.mark.parametrize("raw, message", [([1.0], "returned 1 scores for 2 texts"), ([1.0, math.nan], "NaN")])
def test_output_contract_violations_count_as_failures(raw: list[float], message: str) -> None:
    provider = FakeProvider()
    provider.raw = raw
    reranker = _guarded(provider)
    with pytest.raises(RerankUnavailable, match=message):
        reranker.rerank("q", ["a", "b"])
    assert reranker.breaker.failure_count == 1


def test_probability_scores_are_clamped_not_squashed() -> None:
    provider = FakeProvider(probabilities=True)
    provider.raw = [0.0, 0.25, 1.0000001, -1e-9]
    assert _guarded(provider).rerank("q", ["a", "b", "c", "d"]) == [0.0, 0.25, 1.0, 0.0]


def test_failures_are_never_cached() -> None:
    provider = FakeProvider()
    provider.errors = [RuntimeError("boom")]
    reranker = _guarded(provider)
    with pytest.raises(RerankUnavailable):
        reranker.rerank("q", ["a"])
    assert reranker.rerank("q", ["a"]) == [sigmoid(0.0)]
    assert reranker.rerank("q", ["a"]) == [sigmoid(0.0)]
    assert provider.calls == 2


def test_returned_lists_do_not_alias_the_cache() -> None:
    reranker = _guarded(FakeProvider())
    first = reranker.rerank("q", ["aa"])
    first[0] = -1.0
    assert reranker.rerank("q", ["aa"]) == [sigmoid(1.0)]


def test_cache_size_zero_disables_the_cache() -> None:
    provider = FakeProvider()
    reranker = _guarded(provider, cache_size=0)
    before = REGISTRY.get_sample_value("rerank_cache_requests_total", {"result": "miss"})
    for _ in range(3):
        reranker.rerank("q", ["a"])
    assert provider.calls == 3
    assert REGISTRY.get_sample_value("rerank_cache_requests_total", {"result": "miss"}) == before


def test_cache_is_lru_bounded() -> None:
    provider = FakeProvider()
    reranker = _guarded(provider, cache_size=2)
    for query in ("1", "2", "3"):
        reranker.rerank(query, ["a"])
    reranker.rerank("3", ["a"])
    assert provider.calls == 3
    reranker.rerank("1", ["a"])  # 最早的一条已被挤出
    assert provider.calls == 4


def test_warm_up_loads_through_the_breaker(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[int] = []

    def factory(config: RerankConfig) -> FakeProvider:
        loads.append(1)
        return FakeProvider()

    monkeypatch.setitem(rerank_module._FACTORIES, "fake", factory)
    reranker = get_reranker(RerankConfig(provider="fake", model="warm"))
    assert not reranker.loaded
    reranker.warm_up()
    reranker.warm_up()
    assert reranker.loaded and loads == [1]
    assert loaded_rerank_models() == [{"provider": "fake", "model": "warm"}]


# ---------------------------------------------------------------- 注册表与配置


def test_registry_returns_one_instance_per_config_and_shares_breakers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rerank_module._FACTORIES, "fake", lambda config: FakeProvider())
    first = get_reranker(RerankConfig(provider="fake", model="m1"))
    assert get_reranker(RerankConfig(provider="fake", model="m1")) is first
    other = get_reranker(RerankConfig(provider="fake", model="m1", batch_size=8))
    assert other is not first and other.breaker is first.breaker
    assert first.breaker.name == "rerank:fake:m1"
    assert (first.breaker.failure_threshold, first.breaker.reset_timeout) == (3, 20.0)
    clear_rerankers()
    assert get_reranker(RerankConfig(provider="fake", model="m1")) is not first


def test_concurrent_first_calls_load_once(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[int] = []

    def slow_factory(config: RerankConfig) -> FakeProvider:
        time.sleep(0.05)  # 加载要花时间：并发的首次调用会撞在一起
        loads.append(1)
        return FakeProvider()

    monkeypatch.setitem(rerank_module._FACTORIES, "fake", slow_factory)
    reranker = get_reranker(RerankConfig(provider="fake", model="m"))
    barrier = threading.Barrier(8)
    results: list[list[float]] = []

    def worker(i: int) -> None:
        barrier.wait()
        results.append(reranker.rerank(f"q{i}", ["candidate"]))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(results) == 8 and loads == [1]


def test_register_rerank_provider_and_unknown_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rerank_module, "_FACTORIES", rerank_module._FACTORIES.copy())
    register_rerank_provider("mine", lambda config: FakeProvider())
    assert get_reranker(RerankConfig(provider="mine", model="x")).rerank("q", ["a"]) == [sigmoid(0.0)]
    with pytest.raises(ValueError, match="unknown rerank provider 'nope'"):
        get_reranker(RerankConfig(provider="nope", model="x"))


@pytest.mark.parametrize("field, value", [("batch_size", 0), ("max_length", 0), ("timeout", 0), ("retries", -1),
                                          ("failure_threshold", 0), ("reset_timeout", -1), ("cache_size", -1),
                                          ("cache_ttl", 0), ("api", "grpc")])
def test_invalid_config_values_are_rejected(field: str, value: Any) -> None:
    with pytest.raises(ValueError):
        RerankConfig(**{field: value})


def test_config_defaults_and_hidden_api_key() -> None:
    config = RerankConfig()
    assert (config.provider, config.model, config.retries, config.failure_threshold, config.reset_timeout,
            config.cache_size, config.cache_ttl) == ("flag", "BAAI/bge-reranker-v2-m3", 2, 3, 20.0, 1000, 300.0)
    assert config.breaker_name == "rerank:flag:BAAI/bge-reranker-v2-m3"
    assert RerankConfig(provider="http", url="http://x").model == ""
    assert "secret" not in repr(RerankConfig(provider="http", api_key="secret"))


def test_configured_reranker_follows_settings(settings: Any) -> None:
    settings.RERANK_PROVIDER = "none"
    assert rerank_config() is None and configured_reranker() is None

    settings.RERANK_PROVIDER = "http"
    settings.RERANK_MODEL = "bge-reranker-v2-m3"
    settings.RERANK_URL = "http://gpu-box:8081"
    settings.RERANK_API = "cohere"
    settings.RERANK_API_KEY = "k"
    settings.RERANK_TIMEOUT = 3.5
    settings.RERANK_RETRIES = 1
    settings.RERANK_BREAKER_FAILURES = 4
    settings.RERANK_BREAKER_RESET_SECONDS = 7.0
    settings.RERANK_CACHE_SIZE = 10
    settings.RERANK_CACHE_TTL = 60
    reranker = configured_reranker()
    assert reranker is not None and configured_reranker() is reranker
    config = reranker.config
    assert (config.provider, config.model, config.url, config.api, config.api_key, config.timeout, config.retries,
            config.cache_size, config.cache_ttl) == ("http", "bge-reranker-v2-m3", "http://gpu-box:8081", "cohere",
                                                     "k", 3.5, 1, 10, 60)
    assert (reranker.breaker.failure_threshold, reranker.breaker.reset_timeout) == (4, 7.0)
    assert not reranker.loaded  # 取实例不连接服务


# ---------------------------------------------------------------- 指标


def _sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_cache_metrics_count_hits_and_misses_and_report_the_hit_rate() -> None:
    reranker = _guarded(FakeProvider())
    hits, misses = (_sample("rerank_cache_requests_total", {"result": r}) for r in ("hit", "miss"))
    assert rerank_cache_hit_rate() == 0.0 and _sample("rerank_cache_hit_rate") == 0.0
    reranker.rerank("q", ["a", "b"])
    assert _sample("rerank_cache_hit_rate") == 0.0
    for _ in range(3):
        reranker.rerank("q", ["a", "b"])
    assert _sample("rerank_cache_requests_total", {"result": "hit"}) == hits + 3
    assert _sample("rerank_cache_requests_total", {"result": "miss"}) == misses + 1
    assert _sample("rerank_cache_hit_rate") == 0.75 == rerank_cache_hit_rate()
    clear_rerankers()
    assert _sample("rerank_cache_hit_rate") == 0.0


def test_request_metrics_by_outcome() -> None:
    clock = FakeClock()
    provider = FakeProvider()
    label = f"metrics-{uuid.uuid4().hex[:8]}"
    reranker = _guarded(provider, clock=clock, provider=label, failure_threshold=1)

    def outcome(name: str) -> float:
        return _sample("rerank_requests_total", {"provider": label, "outcome": name})

    assert (outcome("ok"), outcome("error"), outcome("rejected")) == (0.0, 0.0, 0.0)  # 预先创建
    reranker.rerank("q", ["a"])
    reranker.rerank("q", ["a"])  # 缓存命中不计入
    provider.errors = [RuntimeError("boom")]
    with pytest.raises(RerankUnavailable):
        reranker.rerank("q2", ["a"])
    with pytest.raises(RerankUnavailable):
        reranker.rerank("q3", ["a"])
    assert (outcome("ok"), outcome("error"), outcome("rejected")) == (1.0, 1.0, 1.0)


def test_hit_rate_gauge_is_per_live_process_in_multiprocess_mode(tmp_path: Path) -> None:
    """PROMETHEUS_MULTIPROC_DIR 下：liveall 给每个存活进程一条带 pid 的序列（比值不能跨进程求和）。"""
    assert RERANK_CACHE_HIT_RATE._multiprocess_mode == "liveall"
    script = """
import os
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from raglib.providers.breaker import CircuitBreaker
from raglib.providers.rerank import GuardedReranker, RerankConfig

class Provider:
    provider, model, scores_are_probabilities = "fake", "m", False
    def score(self, query, texts):
        return [0.0 for _ in texts]

config = RerankConfig(provider="fake", model="m")
reranker = GuardedReranker(config, Provider, breaker=CircuitBreaker("mp:rerank"))
for _ in range(4):
    reranker.rerank("q", ["a"])
registry = CollectorRegistry()
MultiProcessCollector(registry)
print(registry.get_sample_value("rerank_cache_hit_rate", {"pid": str(os.getpid())}))
print(registry.get_sample_value("rerank_cache_requests_total", {"result": "hit"}))
"""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == ["0.75", "3.0"]
    assert any(p.name.startswith("gauge_liveall_") for p in tmp_path.iterdir())


# ---------------------------------------------------------------- 属性测试

raw_scores = st.lists(st.floats(allow_nan=False, allow_infinity=True), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(raw=raw_scores)
def test_sorted_normalised_scores_are_non_increasing_and_in_unit_interval(raw: list[float]) -> None:
    """见 docs/INVARIANTS.md 的 RERANK-ORDER 与 SCORE-RANGE。
    任意原始分数（含极大、极小、±inf）经保护层归一化后：都有限且在 [0, 1]，按归一化分数排序后分数不增，
    且排序与原始分数一致（sigmoid 单调：原始分数高的归一化分数不会更低）。"""
    provider = FakeProvider()
    provider.raw = raw
    texts = [f"c{i}" for i in range(len(raw))]
    scores = _guarded(provider, cache_size=0).rerank("q", texts)
    assert len(scores) == len(raw)
    assert all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in scores)
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    ranked = [scores[i] for i in order]
    assert all(a >= b for a, b in itertools.pairwise(ranked))
    for i in range(len(raw)):
        for j in range(len(raw)):
            if raw[i] < raw[j]:
                assert scores[i] <= scores[j]


@settings(max_examples=100, deadline=None)
@given(
    load_failures=st.integers(min_value=0, max_value=3),
    kinds=st.lists(st.sampled_from(["transient", "permanent", "local"]), min_size=3, max_size=3),
    rejected_calls=st.integers(min_value=1, max_value=8),
    early=st.floats(min_value=0.0, max_value=19.99),
    probe_fails=st.booleans(),
)
def test_reranker_breaker_opens_rejects_and_recovers(load_failures: int, kinds: list[str], rejected_calls: int,
                                                     early: float, probe_fails: bool) -> None:
    """见 docs/INVARIANTS.md 的 BREAKER-STATES（重排序的 3 次/20 秒配置）。
    假时钟下：连续 3 个失败的请求（加载失败、或提供方失败；每个请求内的重试只算一次）后断路器 open；
    open 时的调用立即以 RerankUnavailable 拒绝、不加载也不调用提供方；20 秒后 half-open，
    探测成功则 closed，探测失败则重新 open。"""
    clock = FakeClock()
    provider = FakeProvider()
    loads: list[int] = []
    sleeps: list[float] = []

    def load() -> FakeProvider:
        loads.append(1)
        if len(loads) <= load_failures:
            raise OSError("weights missing")
        return provider

    config = RerankConfig(provider="fake", model=f"p17-{uuid.uuid4().hex[:10]}")
    breaker = CircuitBreaker(config.breaker_name, failure_threshold=config.failure_threshold,
                             reset_timeout=config.reset_timeout, clock=clock, is_failure=counts_as_failure)
    reranker = GuardedReranker(config, load, breaker=breaker, sleep=sleeps.append, timer=clock)

    # 前 load_failures 个请求在加载时失败，其余请求由提供方按 kinds 失败
    request_kinds = ["load"] * load_failures + kinds[:3 - load_failures]
    for request, kind in enumerate(request_kinds):
        assert breaker.state == "closed" and breaker.failure_count == request
        if kind == "transient":  # 首次 + 2 次重试都失败
            provider.errors = [RerankError("503", transient=True, status=503) for _ in range(3)]
        elif kind == "permanent":
            provider.errors = [RerankError("401", transient=False, status=401)]
        elif kind == "local":
            provider.errors = [RuntimeError("CUDA error")]
        with pytest.raises(RerankUnavailable):
            reranker.rerank(f"q{request}", ["a", "b"])
        assert provider.errors == []
    assert breaker.state == "open"
    assert sleeps == list(RETRY_BACKOFF) * request_kinds.count("transient")

    calls, load_count = provider.calls, len(loads)
    clock.advance(early)
    for i in range(rejected_calls):
        with pytest.raises(RerankUnavailable) as info:
            reranker.rerank(f"rejected{i}", ["a"])
        assert isinstance(info.value.__cause__, CircuitOpenError)
        assert info.value.retry_after == pytest.approx(config.reset_timeout - early)
    assert (provider.calls, len(loads)) == (calls, load_count)
    assert breaker.state == "open"

    clock.advance(config.reset_timeout - early)
    assert breaker.state == "half_open"
    if probe_fails:
        provider.errors = [RuntimeError("still broken")]
        with pytest.raises(RerankUnavailable):
            reranker.rerank("probe", ["a"])
        assert breaker.state == "open"
        with pytest.raises(RerankUnavailable) as info:
            reranker.rerank("probe", ["a"])
        assert isinstance(info.value.__cause__, CircuitOpenError)
        clock.advance(config.reset_timeout)
        assert breaker.state == "half_open"
    provider.errors = []
    assert reranker.rerank("probe", ["a"]) == [sigmoid(float(len("a") - len("probe")))]
    assert breaker.state == "closed" and breaker.failure_count == 0


@settings(max_examples=100, deadline=None)
@given(
    query=st.text(max_size=20),
    texts=st.lists(st.text(max_size=12), min_size=1, max_size=8),
    within=st.floats(min_value=0.0, max_value=299.0),
    data=st.data(),
)
def test_reranker_cache_hits_within_ttl_and_keys_on_order_and_text(query: str, texts: list[str], within: float,
                                                                  data: st.DataObject) -> None:
    """见 docs/INVARIANTS.md 的 RERANK-CACHE。
    TTL（300 秒）内相同的 (query, 候选) 返回缓存的分数、不调用提供方；过期后重新调用；
    候选顺序或文本不同即是不同的键。"""
    clock = FakeClock()
    provider = FakeProvider()
    reranker = _guarded(provider, clock=clock, cache_size=1000, cache_ttl=300)
    first = reranker.rerank(query, texts)
    assert provider.calls == 1
    clock.advance(within)
    assert reranker.rerank(query, list(texts)) == first
    assert provider.calls == 1

    permuted = data.draw(st.permutations(texts))
    reranker.rerank(query, permuted)
    expected_calls = 1 if permuted == texts else 2
    assert provider.calls == expected_calls

    changed = list(texts)
    position = data.draw(st.integers(min_value=0, max_value=len(texts) - 1))
    changed[position] += "x"
    reranker.rerank(query, changed)
    assert provider.calls == expected_calls + 1
    reranker.rerank(query + "?", texts)  # 不同的 query 也是不同的键
    assert provider.calls == expected_calls + 2

    clock.advance(300.0 - within + 0.001)  # 首次写入已满 300 秒
    assert reranker.rerank(query, texts) == first
    assert provider.calls == expected_calls + 3
