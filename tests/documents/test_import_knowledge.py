"""目录导入（manage.py import_knowledge）与 domain 同步 API：版本跳过、变更重同步、删除已移除的条目。"""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

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
    assert "合计：created 5" in output
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
    assert "（dry run）python v2：新建 1，更新 1，未变 1，删除 1" in dry
    assert "garden v1：版本与内容未变，跳过（2 条）" in dry
    assert Document.objects.filter(external_id="py-3").exists()  # dry run 不写入

    fake_embedder.calls.clear()
    output = run_import(directory)
    assert "garden v1：版本与内容未变，跳过" in output
    assert "python v2：新建 1，更新 1，未变 1，删除 1，失败 0；分块 embedding 2、复用 0" in output
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
    assert "broken.json: cannot read JSON" in err.getvalue()
    assert "b: invalid item in ok.json" in err.getvalue()
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
