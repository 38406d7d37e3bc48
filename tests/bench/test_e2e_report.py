"""bench/e2e_search.py 的汇总逻辑：Server-Timing 解析、分位数与服务开销、py-spy 采样的排行。"""

from __future__ import annotations

import pytest

from bench.e2e_report import Profile, Sample, frame_name, parse_server_timing, summarize

ROOT = "/srv/ragservice"
# gthread 的请求线程：栈里有 ThreadWorker.handle
REQUEST = ("_bootstrap (threading.py:1002);"
           "ThreadWorker.handle (/venv/lib/python3.11/site-packages/gunicorn/workers/gthread.py:280)")


def test_parse_server_timing_reads_every_metric_with_a_duration() -> None:
    header = 'embed;dur=12.5, vector;dur=4.0,fulltext;desc="bm25";dur=3, fuse, total;dur=20.25'
    assert parse_server_timing(header) == {"embed": 12.5, "vector": 4.0, "fulltext": 3.0, "total": 20.25}
    assert parse_server_timing("") == {}


def test_overhead_is_end_to_end_minus_model_stages() -> None:
    assert Sample(30.0, {"embed": 18.0, "vector": 4.0, "total": 25.0}).overhead_ms == pytest.approx(12.0)
    assert Sample(30.0, {"embed": 18.0, "rerank": 7.0}).overhead_ms == pytest.approx(5.0)
    assert Sample(9.0, {"fulltext": 3.0}).overhead_ms == pytest.approx(9.0)  # 只做全文：没有模型时间


def test_summarize_percentiles_per_request_and_per_stage() -> None:
    samples = [Sample(float(ms), {"embed": ms / 2, **({"fulltext": 1.0} if ms % 2 else {})}) for ms in range(1, 101)]
    summary = summarize(samples)
    assert summary.count == 100
    assert summary.e2e == pytest.approx((50.5, 95.05, 99.01))
    assert summary.overhead == pytest.approx((25.25, 47.525, 49.505))
    assert list(summary.stages) == ["embed", "fulltext"]
    assert summary.stages["fulltext"] == (1.0, 1.0)  # 只算报告了该阶段的 50 个请求


def test_frame_name_drops_line_numbers_and_path_prefixes() -> None:
    assert frame_name(f"search ({ROOT}/search/services.py:199)", ROOT) == "search (search/services.py)"
    assert frame_name(f"execute ({ROOT}/.venv/lib/python3.11/site-packages/psycopg/cursor.py:97)", ROOT) \
        == "execute (psycopg/cursor.py)"
    assert frame_name("wait (/usr/lib/python3.11/threading.py:320)", ROOT) == "wait (threading.py)"
    assert frame_name("<module> (<string>:7)", ROOT) == "<module> (<string>)"
    assert frame_name("no location", ROOT) == "no location"


def test_profile_ranks_request_frames_and_sets_model_and_idle_samples_aside() -> None:
    raw = [
        f"{REQUEST};post ({ROOT}/search/api/views.py:50);execute ({ROOT}/.venv/lib/python3.11/site-packages/"
        "psycopg/cursor.py:97) 6",
        f"{REQUEST};post ({ROOT}/search/api/views.py:51);dumps (/usr/lib/python3.11/json/__init__.py:231) 2",
        f"_bootstrap (threading.py:1002);_in_worker ({ROOT}/search/services.py:324);"
        f"embed_query ({ROOT}/raglib/providers/e5_torch.py:80);forward (torch/nn/module.py:1) 10",
        "_bootstrap (threading.py:1002);select (/usr/lib/python3.11/selectors.py:468) 5",  # 空闲线程
        "garbage line",
    ]
    profile = Profile()
    profile.add_raw(raw, root=ROOT)
    assert (profile.samples, profile.request_samples, profile.model_samples, profile.ranked_samples) == (23, 18, 10, 8)
    assert profile.top_own(5) == [("execute (psycopg/cursor.py)", 6, 75.0), ("dumps (json/__init__.py)", 2, 25.0)]
    # 直通的外壳（线程、gthread：样本全落在同一个被调函数里）不进累计排行；视图在这里分了叉，留下
    assert profile.top_total(5) == [("post (search/api/views.py)", 8, 100.0), ("execute (psycopg/cursor.py)", 6, 75.0),
                                    ("dumps (json/__init__.py)", 2, 25.0)]
