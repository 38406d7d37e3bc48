"""摄取的补充验收：加密 PDF 经 API 失败且不留分块、reindex 命令、文档后台页面、384/1024 维向量共存且各走 HNSW 索引。"""

from __future__ import annotations

import io
import signal

import numpy as np
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from documents.models import Document, DocumentChunk
from tests.documents.test_api import BID_TEXT, upload
from tests.raglib.test_parsing import make_pdf

pytestmark = pytest.mark.django_db


def test_encrypted_pdf_fails_with_clear_message(client_rw, kb_factory, run_on_commit, fake_embedder):
    kb = kb_factory()
    response = upload(client_rw, kb, "secret.pdf", make_pdf(["Confidential terms"], user="pw"), run_on_commit)
    assert response.status_code == 202
    detail = client_rw.get(f"/documents/{response.json()['document_id']}").json()
    assert detail["status"] == "failed"
    assert detail["error_message"].startswith("Parsing the file failed")
    assert "password" in detail["error_message"].lower()
    assert not DocumentChunk.objects.exists()


def test_reindex_command_by_document_and_kb(client_rw, kb_factory, run_on_commit, fake_embedder):
    kb = kb_factory()
    ids = [upload(client_rw, kb, f"{i}.md", BID_TEXT.encode(), run_on_commit).json()["document_id"] for i in range(2)]
    before = set(DocumentChunk.objects.values_list("id", flat=True))

    out = io.StringIO()
    call_command("reindex", "--document", ids[0], stdout=out)
    assert "1/1" in out.getvalue() and "1 成功，0 失败" in out.getvalue()
    out = io.StringIO()
    call_command("reindex", "--kb", str(kb.id), stdout=out)
    assert "2/2" in out.getvalue() and "2 成功，0 失败" in out.getvalue()
    after = set(DocumentChunk.objects.values_list("id", flat=True))
    assert len(after) == len(before) and not (after & before)
    assert all(d.status == "completed" and d.reindex_status == "" for d in Document.objects.all())


def test_reindex_command_takes_a_name_says_not_found_and_restores_signal_handlers(client_rw, kb_factory,
                                                                                   run_on_commit, fake_embedder):
    """--kb 接受名称或 id；找不到时说“找不到”而不是“没有文档”；命令结束后进程原来的信号处理器原样恢复
    （以前装上就不还，在同一进程里跑过它的测试再也无法用 SIGTERM/SIGINT 停下来）。"""
    kb = kb_factory(name="标书库")
    upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    out = io.StringIO()
    call_command("reindex", "--kb", "标书库", stdout=out)
    assert "1 成功，0 失败" in out.getvalue()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    with pytest.raises(CommandError, match="not found"):
        call_command("reindex", "--kb", "没有这个库", stdout=io.StringIO())
    empty = kb_factory(name="空库")
    with pytest.raises(CommandError, match="no completed or failed documents in knowledge base '空库'"):
        call_command("reindex", "--kb", str(empty.id), stdout=io.StringIO())


def test_reindex_command_reports_failures(kb_factory, fake_embedder):
    kb = kb_factory()
    document = Document.objects.create(knowledge_base=kb, filename="gone.md", status="completed",
                                       stored_path="files/missing.md")
    err = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("reindex", "--document", str(document.id), stdout=io.StringIO(), stderr=err)
    assert "missing" in err.getvalue()
    document.refresh_from_db()
    assert document.status == "completed" and document.reindex_status == "failed"


def test_document_admin_pages_and_reindex_action(admin_client, client_rw, kb_factory, run_on_commit,
                                                 fake_embedder):
    kb = kb_factory()
    document_id = upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    assert admin_client.get(reverse("admin:documents_document_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:documents_document_change", args=[document_id])).status_code == 200
    chunks_url = reverse("admin:documents_documentchunk_changelist")
    page = admin_client.get(chunks_url, {"q": "投标截止时间"})
    assert page.status_code == 200 and "投标截止时间" in page.content.decode()
    run_on_commit(admin_client.post, reverse("admin:documents_document_changelist"),
                  {"action": "reindex", "_selected_action": [document_id]})
    assert Document.objects.get(pk=document_id).reindex_status == ""
    run_on_commit(admin_client.post, reverse("admin:documents_document_changelist"),
                  {"action": "soft_delete", "_selected_action": [document_id]})
    assert Document.objects.get(pk=document_id).status == "deleted"


def _unit(dim: int, seed: int) -> list[float]:
    v = np.random.default_rng(seed).normal(size=dim)
    return (v / np.linalg.norm(v)).tolist()


@pytest.mark.parametrize("dim", [384, 1024])
def test_dimensions_coexist_and_each_uses_its_hnsw_index(kb_factory, dim):
    small, large = kb_factory(), kb_factory(embedding_dimension=1024, embedding_model="BAAI/bge-m3")
    for kb, d in ((small, 384), (large, 1024)):
        document = Document.objects.create(knowledge_base=kb, filename=f"{d}.txt", status="completed")
        DocumentChunk.objects.bulk_create(
            DocumentChunk(knowledge_base=kb, document=document, chunk_index=i, chunk_text=str(i),
                          embedding=_unit(d, i), embedding_dim=d)
            for i in range(20)
        )
    query = "[" + ",".join(map(str, _unit(dim, 99))) + "]"
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            f"EXPLAIN SELECT id FROM document_chunks WHERE embedding_dim = {dim} AND shared_ann "
            f"ORDER BY embedding::vector({dim}) <=> %s::vector({dim}) LIMIT 5",
            [query],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
        assert f"document_chunks_hnsw_{dim}" in plan, plan
        # 列存半精度：每维的相对舍入误差至多 2^-12，单位向量的模偏离 1 约 1e-5 量级，1e-4 是它的好几倍
        cursor.execute(
            f"SELECT count(*) FROM document_chunks WHERE embedding_dim = {dim} "
            f"AND abs(l2_norm(embedding) - 1) < 1e-4"
        )
        assert cursor.fetchone()[0] == 20


def test_dimension_mismatch_is_rejected_by_the_database(kb_factory):
    from django.db import IntegrityError

    kb = kb_factory()
    document = Document.objects.create(knowledge_base=kb, filename="x.txt")
    with pytest.raises(IntegrityError):
        DocumentChunk.objects.create(knowledge_base=kb, document=document, chunk_index=0, chunk_text="x",
                                     embedding=_unit(384, 1), embedding_dim=1024)
