"""知识条目（Agent 按外部 id 写入的结构化知识）的写操作。

一个条目就是一行 ``external_id`` 非空的文档，正文在 ``content`` 里：分块、embedding、COPY 入库、
全文列与 BM25 统计都走上传文档的同一套代码，检索（只看 completed 文档）无需任何改动。

- 幂等：条目摘要（正文 + 元数据 + 分块参数）没变就什么都不做，不调用 embedding。
- 增量：变了就重新分块，只有文本变了的分块重新 embedding，其余复用旧向量（按 text_hash）。
- 原子：旧分块换成新分块在一个事务里完成，检索永远看不到半新半旧的条目；embedding 失败时旧版本照常可检索。
- 并发：同一条目的写入用事务级 advisory lock 串行化（新建时还没有行可锁），最后提交的获胜，不会有重复分块。
- 需要重新 embedding 的分块不超过 RAG_ITEM_SYNC_MAX_CHUNKS 时在请求内同步完成；否则交给摄取队列（202），
  排队期间旧版本照常可检索。
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from documents.ingestion import (
    Run,
    copy_chunks,
    embed_drafts,
    ingestion_submit,
    item_parsed,
    lock_knowledge_base_for_write,
    reusable_vectors,
)
from documents.models import Document
from documents.selectors import item_not_found
from infra import metrics
from infra.context import current_request_id
from infra.embedders import embedder
from infra.errors import ApplicationError, ErrorCode, ErrorDetail
from knowledge.models import KnowledgeBase
from knowledge.options import ITEM_CHUNKING_DEFAULTS, chunking_options, options_dict
from knowledge.selectors import knowledge_base_unavailable
from raglib.chunking import ChunkDraft, ChunkingOptions, Tokenizer, chunk_text
from raglib.providers.breaker import CircuitOpenError
from raglib.providers.embedding import EmbeddingError

logger = structlog.get_logger(__name__)

# 条目自带的字段；其余元数据键原样保存并复制到每个分块
ITEM_FIELDS = ("title", "domain", "category", "tags")
ITEM_FORMAT = "item"


@dataclass(frozen=True)
class ItemInput:
    """一次写入的条目内容（已通过格式校验）。"""

    external_id: str
    content: str
    title: str = ""
    domain: str = ""
    category: str = ""
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)

    def document_metadata(self) -> dict[str, Any]:
        """存进文档并复制到每个分块的元数据：检索的 domain/category/tags 过滤读的就是它。"""
        return {**self.metadata, "external_id": self.external_id, "title": self.title, "domain": self.domain,
                "category": self.category, "tags": list(self.tags)}


@dataclass
class ItemResult:
    """一个条目的写入结果：created / updated / unchanged / queued / failed。"""

    external_id: str
    result: str
    document: Document | None = None
    chunks_embedded: int = 0
    chunks_reused: int = 0
    error: ApplicationError | None = None


@dataclass
class _Prepared:
    item: ItemInput
    digest: str
    existing: Document | None
    drafts: list[ChunkDraft] = field(default_factory=list)


def item_options(kb: KnowledgeBase) -> ChunkingOptions:
    """条目的分块参数：默认 paragraph（按段落），知识库的 ``item_chunking`` 可覆盖。"""
    return chunking_options(ITEM_CHUNKING_DEFAULTS, kb.item_chunking, field_name="item_chunking")


def item_digest(item: ItemInput, options: ChunkingOptions) -> str:
    """被索引的一切（正文、元数据、分块参数）的摘要；相同则重写入没有任何工作要做。"""
    payload = {"content": item.content, "metadata": item.document_metadata(), "chunking": options_dict(options)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def _is_current(document: Document | None, digest: str) -> bool:
    """文档已按这个摘要完整索引（没有排队中或失败的更新）。"""
    return (document is not None and document.content_hash == digest
            and document.status == Document.Status.COMPLETED and not document.reindex_status)


def _chunk(kb: KnowledgeBase, item: ItemInput, options: ChunkingOptions) -> list[ChunkDraft]:
    provider = embedder(kb.embedding_provider, kb.embedding_model) if options.strategy == "semantic" else None
    drafts = chunk_text(item.content, options, tokenizer=Tokenizer.load(settings.TOKENIZER or None),
                        embed=provider.embed_documents if provider is not None else None)
    if not drafts:
        raise ApplicationError(ErrorCode.VALIDATION_ERROR, "The item contains no text to index", 400,
                               [ErrorDetail("content", "EMPTY", "Content must contain indexable text")])
    return drafts


def embedding_unavailable(exc: Exception) -> ApplicationError:
    """embedding 失败翻译成错误契约：暂时性（熔断、服务 5xx）给 503 与重试提示，其余 502。"""
    if isinstance(exc, CircuitOpenError) or (isinstance(exc, EmbeddingError) and exc.transient):
        retry_after = settings.BREAKER_RESET_SECONDS
        return ApplicationError(
            ErrorCode.SERVICE_UNAVAILABLE,
            f"The embedding model is temporarily unavailable; the previous version stays searchable: {exc}", 503,
            [ErrorDetail("embedding", "RETRY_LATER", f"Retry in {retry_after} s")],
            headers={"Retry-After": str(retry_after)},
        )
    return ApplicationError(ErrorCode.EMBEDDING_FAILED, f"The embedding model failed: {exc}", 502,
                            [ErrorDetail("embedding", "FAILED", str(exc))])


def _lock_item(kb: KnowledgeBase, external_id: str) -> Document | None:
    """事务内：串行化同一条目的写入，并锁住它的行（若已存在）。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"item:{kb.pk}:{external_id}"])
    locked = lock_knowledge_base_for_write(kb)
    if not locked.is_enabled:
        raise knowledge_base_unavailable(locked)
    return Document.objects.select_for_update().filter(knowledge_base=kb, external_id=external_id).first()


def _apply(document: Document, item: ItemInput, digest: str, options: ChunkingOptions) -> None:
    document.filename = item.external_id[:512]
    document.content = item.content
    document.content_hash = digest
    document.metadata = item.document_metadata()
    document.chunking = options_dict(options)
    document.format = ITEM_FORMAT
    encoded = item.content.encode("utf-8")
    document.size_bytes = len(encoded)
    document.sha256 = hashlib.sha256(encoded).hexdigest()
    document.request_id = current_request_id() or ""
    document.error_message = ""
    document.stage = ""


def _store(kb: KnowledgeBase, prepared: _Prepared, vectors: Sequence[Any], options: ChunkingOptions) -> ItemResult:
    """一个事务：锁住条目，替换分块并写入新版本。并发写入者按锁的顺序依次生效（最后提交的获胜）。"""
    item = prepared.item
    with transaction.atomic():
        document = _lock_item(kb, item.external_id)
        if _is_current(document, prepared.digest):
            return ItemResult(item.external_id, "unchanged", document)
        # 经文档接口删除后留下的墓碑：对条目而言是重新创建
        result = "updated" if document is not None and document.status != Document.Status.DELETED else "created"
        if document is None:
            document = Document(knowledge_base=kb, external_id=item.external_id)
        _apply(document, item, prepared.digest, options)
        document.status = Document.Status.COMPLETED
        document.reindex_status = ""
        document.chunk_count = len(prepared.drafts)
        document.finished_at = timezone.now()
        document.save()
        run = Run(document=document, kb=kb, reindex=False, deadline=math.inf)
        copy_chunks(run, item_parsed(item.content), prepared.drafts, vectors)
    logger.info("item_stored", external_id=item.external_id, result=result, chunks=len(prepared.drafts))
    return ItemResult(item.external_id, result, document)


def _enqueue(kb: KnowledgeBase, prepared: _Prepared, options: ChunkingOptions) -> ItemResult:
    """大条目：记下新内容并交给摄取队列；已有版本保持 completed、照常可检索，直到新分块提交。"""
    item = prepared.item
    with transaction.atomic():
        document = _lock_item(kb, item.external_id)
        if _is_current(document, prepared.digest):
            return ItemResult(item.external_id, "unchanged", document)
        if document is None:
            document = Document(knowledge_base=kb, external_id=item.external_id, status=Document.Status.PROCESSING)
        elif document.status == Document.Status.COMPLETED:
            document.reindex_status = Document.Reindex.QUEUED
        else:
            document.status = Document.Status.PROCESSING
        _apply(document, item, prepared.digest, options)
        document.save()
        ingestion_submit(document)
    logger.info("item_queued", external_id=item.external_id, chunks=len(prepared.drafts))
    return ItemResult(item.external_id, "queued", document)


def _prepare(kb: KnowledgeBase, items: Sequence[ItemInput],
             options: ChunkingOptions) -> tuple[list[_Prepared], list[ItemResult]]:
    """算摘要、找出已有行，摘要没变的直接判为 unchanged（不分块、不 embedding）。"""
    existing = {d.external_id: d for d in Document.objects.filter(
        knowledge_base=kb, external_id__in=[i.external_id for i in items])}
    prepared: list[_Prepared] = []
    done: list[ItemResult] = []
    for item in items:
        digest = item_digest(item, options)
        document = existing.get(item.external_id)
        if _is_current(document, digest):
            done.append(ItemResult(item.external_id, "unchanged", document))
            continue
        try:
            prepared.append(_Prepared(item, digest, document, _chunk(kb, item, options)))
        except ApplicationError as exc:
            done.append(ItemResult(item.external_id, "failed", error=exc))
    return prepared, done


def _embed_and_store(kb: KnowledgeBase, prepared: Sequence[_Prepared],
                     options: ChunkingOptions) -> list[ItemResult]:
    """跨条目合批 embedding（文本没变的分块复用旧向量），再逐个条目各自一个事务入库。"""
    if not prepared:
        return []
    provider = embedder(kb.embedding_provider, kb.embedding_model)
    reusable = reusable_vectors([p.existing.pk for p in prepared if p.existing is not None],
                                kb.embedding_dimension)
    try:
        embedded = embed_drafts([p.drafts for p in prepared], provider, reusable)
    except (CircuitOpenError, EmbeddingError) as exc:
        error = embedding_unavailable(exc)
        logger.warning("item_embedding_failed", items=len(prepared), error=str(exc))
        return [ItemResult(p.item.external_id, "failed", p.existing, error=error) for p in prepared]
    results = []
    for entry, vectors in zip(prepared, embedded.vectors, strict=True):
        try:
            result = _store(kb, entry, vectors, options)
        except ApplicationError as exc:
            result = ItemResult(entry.item.external_id, "failed", entry.existing, error=exc)
        if result.result != "unchanged":
            reused = sum(1 for d in entry.drafts if d.role != "parent" and _reused(d, reusable))
            result.chunks_reused = reused
            result.chunks_embedded = sum(1 for d in entry.drafts if d.role != "parent") - reused
        results.append(result)
    logger.info("items_embedded", items=len(prepared), computed=embedded.computed, reused=embedded.reused)
    metrics.ITEM_CHUNKS.labels(kind="embedded").inc(embedded.computed)
    metrics.ITEM_CHUNKS.labels(kind="reused").inc(embedded.reused)
    return results


def _reused(draft: ChunkDraft, reusable: dict[str, Any]) -> bool:
    return hashlib.sha256(draft.text.encode("utf-8")).hexdigest() in reusable


def _record(results: Sequence[ItemResult], started: float) -> None:
    """结果计数进指标，并记一行带耗时的日志（见 docs/INVARIANTS.md 的 STRUCTURED-LOGS）。"""
    counts: dict[str, int] = {}
    for result in results:
        counts[result.result] = counts.get(result.result, 0) + 1
        metrics.ITEM_WRITES.labels(result=result.result).inc()
    logger.info("items_written", duration_ms=round((time.perf_counter() - started) * 1000, 1), **counts)


def item_upsert(*, kb: KnowledgeBase, item: ItemInput) -> ItemResult:
    """写入一个条目（PUT）。要重算的分块少则同步完成，多则入队（result=queued）。

    embedding 失败抛 503/502，旧版本不动。
    """
    started = time.perf_counter()
    result = _upsert_one(kb, item)
    _record([result], started)
    if result.error is not None:
        raise result.error
    return result


def _upsert_one(kb: KnowledgeBase, item: ItemInput) -> ItemResult:
    """单个条目：未变直接返回；要重算的分块超出同步预算则入队，否则同步写入。"""
    options = item_options(kb)
    prepared, done = _prepare(kb, [item], options)
    if done:
        return done[0]
    entry = prepared[0]
    # 预算按“需要重新 embedding 的分块数”算：大条目改一段仍然同步完成，只有大量新文本才排队
    reusable = reusable_vectors([entry.existing.pk] if entry.existing is not None else [], kb.embedding_dimension)
    if sum(1 for d in entry.drafts if d.role != "parent" and not _reused(d, reusable)) > settings.ITEM_SYNC_MAX_CHUNKS:
        return _enqueue(kb, entry, options)
    return _embed_and_store(kb, prepared, options)[0]


def item_bulk_upsert(*, kb: KnowledgeBase, items: Sequence[ItemInput]) -> list[ItemResult]:
    """批量写入：每个条目一个结果，一个条目失败不影响其他条目；embedding 跨条目合批，全部同步完成。"""
    started = time.perf_counter()
    options = item_options(kb)
    prepared, done = _prepare(kb, items, options)
    by_id = {r.external_id: r for r in [*done, *_embed_and_store(kb, prepared, options)]}
    results = [by_id[item.external_id] for item in items]
    _record(results, started)
    return results


def item_delete(*, kb: KnowledgeBase, external_id: str) -> None:
    """删除条目：行与分块在一个事务里删掉，提交后立刻从检索中消失。"""
    with transaction.atomic():
        document = _lock_item(kb, external_id)
        if document is None or document.status == Document.Status.DELETED:
            raise item_not_found(external_id)
        document.delete()
    logger.info("item_deleted", external_id=external_id)


def items_delete(*, kb: KnowledgeBase, document_ids: Sequence[uuid.UUID]) -> int:
    """按文档 id 批量删除条目（目录同步移除文件里已不存在的条目）。"""
    with transaction.atomic():
        lock_knowledge_base_for_write(kb)
        deleted = Document.objects.filter(knowledge_base=kb, pk__in=list(document_ids)).exclude(external_id="")
        count = deleted.count()
        deleted.delete()
    return count
