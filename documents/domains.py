"""按 domain 整体同步知识条目（目录导入与同步 API 共用）。

每个 domain 在数据库里有一行 :class:`KnowledgeDomain`，记着上次同步的版本号与内容摘要：
两者都没变就整个跳过（启动/重复导入几乎零成本）；变了就逐条同步（条目摘要没变的仍然不做任何工作），
并删除文件里已经不存在的条目。
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import structlog
from django.db import transaction

from documents.items import ItemInput, item_bulk_upsert, item_digest, item_options, items_delete
from documents.models import Document, KnowledgeDomain
from knowledge.models import KnowledgeBase

logger = structlog.get_logger(__name__)

# 每批写入的条目数：批内合并 embedding 调用，批间更新进度
SYNC_BATCH = 64

ProgressFn = Callable[[int, int], None]


@dataclass
class DomainSyncStats:
    """一次 domain 同步的统计；``skipped`` 表示版本与内容都没变、什么都没做。"""

    domain: str
    version: str
    skipped: bool = False
    dry_run: bool = False
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    queued: int = 0
    removed: int = 0
    failed: int = 0
    chunks_embedded: int = 0
    chunks_reused: int = 0
    seconds: float = 0.0
    failures: tuple[str, ...] = ()
    # 当前版本写入的时间（ISO 8601）；跳过时另给写入它的那次同步的统计：超时后重试的调用方据此知道
    # 第一次尝试已经做了什么（重试本身只会答“跳过”）
    synced_at: str | None = None
    last_applied: dict[str, object] | None = None

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "failures": list(self.failures)}


def domain_digest(items: Sequence[ItemInput]) -> str:
    """整个 domain 内容的摘要（与条目顺序无关）。"""
    canonical = sorted(
        json.dumps({"content": i.content, "metadata": i.document_metadata()}, sort_keys=True, ensure_ascii=False)
        for i in items
    )
    return hashlib.sha256("\n".join(canonical).encode("utf-8")).hexdigest()


def _domain_items(kb: KnowledgeBase, domain: str) -> dict[str, Document]:
    return {d.external_id: d for d in Document.objects.filter(knowledge_base=kb, metadata__domain=domain)
            .exclude(external_id="")}


def _plan(kb: KnowledgeBase, items: Sequence[ItemInput], current: dict[str, Document],
          stats: DomainSyncStats) -> None:
    """--dry-run：只比较摘要，算出会新建、更新、不变的条目数。"""
    options = item_options(kb)
    for item in items:
        document = current.get(item.external_id)
        if document is None:
            stats.created += 1
        elif document.content_hash == item_digest(item, options):
            stats.unchanged += 1
        else:
            stats.updated += 1


def domain_sync(*, kb: KnowledgeBase, domain: str, version: str, items: Sequence[ItemInput],
                dry_run: bool = False, progress: ProgressFn | None = None,
                invalid: Sequence[tuple[str, str]] = ()) -> DomainSyncStats:
    """把一个 domain 同步成 ``items``：版本与内容摘要都没变则跳过；否则逐条写入并删除已不存在的条目。

    ``invalid`` 是文件里格式不合法的条目（外部 id, 原因）：它们计为失败，且**不会**因为“不在 items 里”被删除——
    手误不该让知识库丢数据；这个 domain 也不记为已初始化，改好后下次导入会重试。
    """
    started = time.monotonic()
    items = [ItemInput(**{**asdict(i), "domain": domain}) for i in items]
    digest = domain_digest(items)
    stats = DomainSyncStats(domain=domain, version=version, dry_run=dry_run)
    record = KnowledgeDomain.objects.filter(knowledge_base=kb, domain=domain).first()
    if (not invalid and record is not None and record.status == KnowledgeDomain.Status.INITIALIZED
            and record.version == version and record.content_hash == digest):
        stats.skipped = True
        stats.unchanged = record.item_count
        stats.synced_at = record.synced_at.isoformat()
        stats.last_applied = record.stats
        logger.info("domain_sync_skipped", domain=domain, version=version)
        return stats
    current = _domain_items(kb, domain)
    wanted = {i.external_id for i in items} | {external_id for external_id, _ in invalid}
    gone = [d.pk for external_id, d in current.items() if external_id not in wanted]
    stats.failed = len(invalid)
    errors = [f"{external_id}: {reason}" for external_id, reason in invalid]
    stats.failures = tuple(errors)
    if dry_run:
        _plan(kb, items, current, stats)
        stats.removed = len(gone)
        return stats
    for start in range(0, len(items), SYNC_BATCH):
        for result in item_bulk_upsert(kb=kb, items=items[start : start + SYNC_BATCH]):
            setattr(stats, result.result, getattr(stats, result.result) + 1)
            stats.chunks_embedded += result.chunks_embedded
            stats.chunks_reused += result.chunks_reused
            if result.error is not None:
                errors.append(f"{result.external_id}: {result.error.message}")
        if progress is not None:
            progress(min(start + SYNC_BATCH, len(items)), len(items))
    stats.removed = items_delete(kb=kb, document_ids=gone) if gone else 0
    stats.failures = tuple(errors)
    stats.seconds = round(time.monotonic() - started, 3)
    with transaction.atomic():
        record, _ = KnowledgeDomain.objects.update_or_create(
            knowledge_base=kb, domain=domain,
            defaults={"version": version, "content_hash": digest, "item_count": len(items), "stats": stats.as_dict(),
                      # 有条目失败时不记为已初始化：下次导入即使版本没变也会重试
                      "status": KnowledgeDomain.Status.FAILED if errors else KnowledgeDomain.Status.INITIALIZED},
        )
    stats.synced_at = record.synced_at.isoformat()
    logger.info("domain_synced", **{k: v for k, v in stats.as_dict().items() if k not in ("failures", "last_applied")})
    return stats
