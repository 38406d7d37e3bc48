"""维护者控制台（Django admin）：首页概览的数字、文档列表的进度/错误/OCR 列、分块详情，
以及在无头 Chromium 里逐页截图（截图存到 var/screenshots/，并断言没有横向溢出、表头字号可读）。"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone
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
    assert f'title="{LONG_ERROR}"' in html and LONG_ERROR[:119] + "…" in html
    assert "<td class=\"field-ocr\">跳过</td>" in html and "未跳过（rapidocr）" in html
    assert "icon-no.svg" not in html  # OCR 不再用红色 ✗


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


def _screenshot(driver: Any, name: str) -> dict[str, Any]:
    """整页截图并返回版面数据：页面或其中的表格容器是否横向溢出（出现滚动条）、表头的最小字号。"""
    height = driver.execute_script("return Math.max(document.documentElement.scrollHeight, document.body.scrollHeight,"
                                   " document.getElementById('main')?.scrollHeight || 0)")
    driver.set_window_size(1400, min(max(height, 800), 4000))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
    layout: dict[str, Any] = driver.execute_script("""
        const boxes = [document.documentElement, ...document.querySelectorAll('.results, .module, #content-main')];
        const over = boxes.filter(box => box.scrollWidth > box.clientWidth)
                          .map(box => `${box.id || box.className}: ${box.scrollWidth - box.clientWidth}px`);
        const sizes = [...document.querySelectorAll('thead th')].map(th => parseFloat(getComputedStyle(th).fontSize));
        return {overflow: over, header_px: sizes.length ? Math.min(...sizes) : null};
    """)
    return layout


@pytest.mark.browser
def test_console_pages_in_headless_chromium(live_server: Any, transactional_db: None, console: dict[str, Any],
                                            shop: KnowledgeBase, browser: Any) -> None:
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

    pages = {
        "01-admin-index": reverse("admin:index"),
        "02-document-list": reverse("admin:documents_document_changelist"),
        "03-document-failed": reverse("admin:documents_document_change", args=[console["failed"].pk]),
        "04-chunk-detail": reverse("admin:documents_documentchunk_change", args=[console["chunk"].pk]),
        "05-cleanup-tasks": reverse("admin:knowledge_cleanuptask_changelist"),
        "06-playground": f"{PLAYGROUND_URL}?knowledge_base={shop.id}&query=无理由退货&mode=hybrid&top_k=5&order=score",
    }
    for name, path in pages.items():
        browser.set_window_size(1400, 1000)
        browser.get(live_server.url + path)
        wait.until(ec.presence_of_element_located((By.ID, "content")))
        assert "ragservice 管理后台" in browser.find_element(By.ID, "site-name").text, name
        layout = _screenshot(browser, name)
        assert layout["overflow"] == [], (name, layout)
        assert layout["header_px"] is None or layout["header_px"] >= 12, (name, layout)

    # 调试页：长结果的展开方式一致——点开后预览隐藏、全文出现
    browser.set_window_size(1400, 1000)
    browser.get(live_server.url + pages["06-playground"])
    wait.until(ec.presence_of_element_located((By.ID, "results")))
    for details in browser.find_elements(By.CSS_SELECTOR, "#results details.chunk"):
        details.find_element(By.TAG_NAME, "summary").click()
        assert not details.find_element(By.CSS_SELECTOR, ".preview").is_displayed()
        assert details.find_element(By.CSS_SELECTOR, "div.chunk-text").is_displayed()
    _screenshot(browser, "07-playground-expanded")
