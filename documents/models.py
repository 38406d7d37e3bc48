"""文档与分块的数据模型。

分块表只有一个 ``embedding`` 列，但每个知识库使用自己的 embedding 模型，维度可能不同
（multilingual-e5-small 384 维、BGE-M3 1024 维）。做法：列不固定维度，另存 ``embedding_dim``，
用 CHECK 约束保证二者一致，再为每个支持的维度建一个“表达式 + 部分”HNSW 索引
（``(embedding::vector(N)) vector_cosine_ops WHERE embedding_dim = N``）。
检索时按知识库的维度带上同样的 cast 与条件即可命中对应索引，不同模型的向量永不混用。

列本身存半精度（``halfvec``，每维 2 字节），索引与距离仍按规格用 float32 的 ``vector_cosine_ops``（表达式里 cast 回
``vector(N)``）。向量留在行内（``STORAGE MAIN``，精确扫描不读 TOAST），一行的大小决定一页放几行：384 维 float32 的
行约 2 KB，一页 4 行；半精度时约 1.3 KB，一页 6 行。1024 维（BGE-M3）的 float32 行约 4.3 KB，一页只放得下 1 行，
半精度时 3 行。每维的相对舍入误差至多 2^-12，余弦的误差在 1e-4 量级（开发集上的比较见 docs/EVALUATION.md）。
"""

from __future__ import annotations

import uuid

from django.contrib.postgres.indexes import OpClass
from django.db import models
from django.db.models import Q
from django.db.models.functions import Cast
from pgvector.django import HalfVectorField, HnswIndex, VectorField

from jobs.models import JobTarget
from knowledge.models import SUPPORTED_DIMENSIONS, KnowledgeBase

HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64


def hnsw_index(dim: int) -> HnswIndex:
    """按维度的共享 HNSW 索引：只收 ``shared_ann`` 的分块（见 :class:`DocumentChunk` 的这一列）。"""
    return HnswIndex(
        OpClass(Cast("embedding", VectorField(dimensions=dim)), name="vector_cosine_ops"),
        name=f"document_chunks_hnsw_{dim}",
        m=HNSW_M,
        ef_construction=HNSW_EF_CONSTRUCTION,
        condition=Q(embedding_dim=dim, shared_ann=True),
    )


def kb_index_name(kb_id: uuid.UUID) -> str:
    """知识库自己的 HNSW 索引名（63 字节以内）。索引由 ``search.ann`` 建、删与使用；名字定在这里，因为写入分块时
    要看这个索引在不在（:func:`documents.ingestion.copy_chunks`），而 documents 层不导入 search。"""
    return f"document_chunks_ann_{kb_id.hex}"


# 知识库自己的索引的状态：是否可用、操作符类（压缩方式）、定义（二值量化的中心向量在其中）。写入分块时由它决定
# 分块进不进共享索引（documents.ingestion），检索把它并进读分块数的那条查询（search.retrieval.search_plan），
# 建、删索引单独查（search.ann）——“可用”只在这里定义一次
INDEX_STATE_SQL = ("SELECT i.indisvalid AND i.indisready AS valid, o.opcname, pg_get_indexdef(c.oid) AS definition"
                   " FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid"
                   " JOIN pg_opclass o ON o.oid = i.indclass[0] WHERE c.relname = %s")


# 知识库自己的图的部分条件里排除还没进图的分块（``DocumentChunk.ann_pending``）的那一项：search.ann 建图时写进去，
# 写入与检索都看图的定义里有没有它。没有它的是 documents.0015 之前建的图，写入时照旧直接进图，直到定时同步在旁边重建
GRAPH_PENDING_CLAUSE = "NOT ann_pending"


def graph_excludes_pending(definition: str | None) -> bool:
    """知识库自己的图（``pg_get_indexdef`` 的输出）是否不收还没进图的分块。"""
    return GRAPH_PENDING_CLAUSE in (definition or "")


class Document(JobTarget, models.Model):
    """上传到知识库的一份文档；``deleted`` 是墓碑状态，用来区分“已删除”与“从未存在”。

    处理它的工作（摄取、重新索引）是另一张表里的作业（``jobs.Job``）：尝试次数、租约、重试时间都在那里。
    """

    class Status(models.TextChoices):
        PROCESSING = "processing", "处理中"
        COMPLETED = "completed", "已完成"
        FAILED = "failed", "失败"
        DELETED = "deleted", "已删除"

    class Reindex(models.TextChoices):
        QUEUED = "queued", "排队中"
        RUNNING = "running", "运行中"
        FAILED = "failed", "失败"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # 外键不另建单列索引：documents_kb_status_idx 以 knowledge_base_id 开头，按知识库查找与级联删除都用它
    knowledge_base = models.ForeignKey(
        KnowledgeBase, on_delete=models.CASCADE, related_name="documents", verbose_name="知识库", db_index=False
    )
    filename = models.CharField("文件名", max_length=512)
    status = models.CharField("状态", max_length=16, choices=Status.choices, default=Status.PROCESSING)
    error_message = models.TextField("错误信息", blank=True, default="")
    chunk_count = models.PositiveIntegerField("分块数", default=0)
    # 调用方给的元数据（title/domain/category/tags 与自由键），会复制到每个分块
    metadata = models.JSONField("元数据", default=dict, blank=True)
    format = models.CharField("格式", max_length=16, blank=True, default="")
    size_bytes = models.PositiveBigIntegerField("大小（字节）", default=0)
    sha256 = models.CharField("SHA-256", max_length=64, blank=True, default="")
    stored_path = models.CharField("原始文件", max_length=1024, blank=True, default="",
                                   help_text="相对 RAG_DATA_DIR 的路径，重新索引时从这里读取")
    chunking = models.JSONField("分块参数覆盖", default=dict, blank=True)
    ocr_skipped = models.BooleanField("OCR 被跳过", default=False)
    ocr_engine = models.CharField("OCR 引擎", max_length=32, blank=True, default="")
    stage_timings = models.JSONField("各阶段耗时（毫秒）", default=dict, blank=True)
    # 正在执行的阶段（parse/chunk/embed/store），给用户看的进度；空表示没有 worker 在处理（排队中或已结束）
    stage = models.CharField("当前阶段", max_length=16, blank=True, default="")
    # 重新索引期间文档保持 completed、旧分块照常可检索，新分块提交时原子替换
    reindex_status = models.CharField("重新索引", max_length=16, choices=Reindex.choices, blank=True, default="")
    request_id = models.CharField("发起请求 ID", max_length=64, blank=True, default="")
    # 知识条目（Agent 按外部 id 写入的结构化知识）也是一行文档：这样检索（只看 completed 文档）无需任何改动。
    # 普通上传的文档 external_id 为空；条目的正文存在 content 里，content_hash 是已索引版本的摘要
    external_id = models.CharField("条目外部 id", max_length=255, blank=True, default="")
    content = models.TextField("条目正文", blank=True, default="")
    content_hash = models.CharField("条目摘要", max_length=64, blank=True, default="")
    created_at = models.DateTimeField("创建时间", auto_now_add=True)
    updated_at = models.DateTimeField("更新时间", auto_now=True)
    finished_at = models.DateTimeField("完成时间", null=True, blank=True)

    class Meta:
        db_table = "documents"
        verbose_name = "文档"
        verbose_name_plural = "文档"
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["processing", "completed", "failed", "deleted"]),
                name="documents_status_valid",
            ),
            # 同一知识库内外部 id 唯一：并发写同一条目也只会有一行（写入方另用 advisory lock 串行化）
            models.UniqueConstraint(fields=["knowledge_base", "external_id"], condition=~Q(external_id=""),
                                    name="documents_kb_external_id_uniq"),
        ]
        indexes = [
            models.Index(fields=["knowledge_base", "status"], name="documents_kb_status_idx"),
            models.Index(fields=["status", "updated_at"], name="documents_status_updated_idx"),
        ]

    def __str__(self) -> str:
        return self.filename


class DocumentChunk(models.Model):
    """文档的一个分块及其向量（L2 归一化后存储）。

    parent_child 分块时，父块（role=parent）只存文本不存向量，子块（role=child）指向父块；
    检索只在 chunk/child 上进行。
    """

    class Role(models.TextChoices):
        CHUNK = "chunk", "分块"
        PARENT = "parent", "父块"
        CHILD = "child", "子块"

    id = models.BigAutoField(primary_key=True)
    # 三个外键都不另建单列索引（每个索引都要在每次写入时维护，大表上还占空间）：knowledge_base 与 parent
    # 由 Meta.indexes 里的同名列索引覆盖，document 由唯一约束 (document, chunk_index) 的索引覆盖
    knowledge_base = models.ForeignKey(
        KnowledgeBase, on_delete=models.CASCADE, related_name="chunks", verbose_name="知识库", db_index=False
    )
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks", verbose_name="文档",
                                 db_index=False)
    chunk_index = models.PositiveIntegerField("序号")
    chunk_text = models.TextField("文本")
    metadata = models.JSONField("元数据", default=dict, blank=True)
    embedding = HalfVectorField("向量", null=True, blank=True)
    embedding_dim = models.PositiveSmallIntegerField("向量维度", null=True, blank=True)
    role = models.CharField("角色", max_length=8, choices=Role.choices, default=Role.CHUNK)
    parent = models.ForeignKey("self", on_delete=models.CASCADE, null=True, blank=True, related_name="children",
                               verbose_name="父块", db_index=False)
    token_count = models.PositiveIntegerField("token 数", default=0)
    # 文本的 SHA-256：重新索引时文本未变的分块直接复用旧向量
    text_hash = models.CharField("文本摘要", max_length=64, blank=True, default="")
    # 过渡列：写入分块的语句（摄取的 COPY、重新索引的 UPDATE）带上 raglib.analysis.document_terms 在 Python 侧生成的
    # tsvector 文本（jieba / 字 bigram 切词、繁转简、英文词干，与数据库 locale 无关），BEFORE ROW 触发器把它登记进全文
    # 引擎（L0 的一行，合并后是序号表里的正排，search/sql/fulltext_stats_maintain.v6.sql），再置 NULL 存下去：读分块行时
    # 它总是 NULL。以前它留在行里当分块的正排（10 万块的库每块 2.1 KB，全文数据里最大的一项）；现在要位置时对原文重新
    # 切词（search.chunk_terms）。见 docs/INVARIANTS.md 的 CHUNK-TERMS-IN-ENGINE
    search_vector = models.TextField("全文索引（tsvector 文本）", null=True, blank=True)  # noqa: DJ001
    # 分块的词数（标题 + 正文）：BM25 的文档长度，与登记进引擎的长度相同；知识库级统计由引擎维护（见 search.bm25）
    search_length = models.PositiveIntegerField("全文词数", db_default=0)
    # 分块是否进按维度的共享 HNSW 索引（它的部分条件）。知识库有了自己的可用索引（search.ann）之后写进来的分块为假：
    # 它们只进自己那张图。否则每块要插两张图，10 万块的库有自己的索引时写入只有没有它时的三分之一（bench/README.md）。
    # 共享索引只在知识库自己的索引缺失时才被用到；那时库里若有为假的分块，检索改走精确扫描
    # （search.retrieval.SearchPlan；改压缩方式时新图建在旧图旁边，不会缺）
    shared_ann = models.BooleanField("进共享向量索引", db_default=True, editable=False)
    # 分块还没插进知识库自己的 HNSW 图（图的部分条件是 ``NOT ann_pending``）。有自己的图的知识库新写入的分块为真：
    # 写入不等每块约 1 ms 的图插入，检索对这些分块精确扫描、与图的结果合并（search.ann），后台任务再把它们改成假，
    # 这次 UPDATE 才把它们插进图里。一个知识库最多攒 ``RAG_ANN_PENDING_MAX_CHUNKS`` 块，攒满了新分块直接进图
    ann_pending = models.BooleanField("暂未进向量图", db_default=False, editable=False)
    created_at = models.DateTimeField("创建时间", auto_now_add=True)

    class Meta:
        db_table = "document_chunks"
        verbose_name = "分块"
        verbose_name_plural = "分块"
        ordering = ["document_id", "chunk_index"]
        constraints = [
            models.UniqueConstraint(fields=["document", "chunk_index"], name="document_chunks_doc_index_uniq"),
            models.CheckConstraint(
                condition=Q(embedding__isnull=True, embedding_dim__isnull=True)
                | Q(embedding__isnull=False, embedding_dim__isnull=False),
                name="document_chunks_embedding_dim_paired",
            ),
        ]
        indexes = [
            models.Index(fields=["knowledge_base"], name="document_chunks_kb_idx"),
            models.Index(fields=["parent"], name="document_chunks_parent_idx"),
            # 只收不在共享索引里的分块：检索一次探查就知道知识库有没有这样的分块（去重后每行约几个字节）
            models.Index(fields=["knowledge_base"], name="document_chunks_detached_idx", condition=Q(shared_ann=False)),
            # 还没进图的分块：检索按知识库取出它们精确扫描，后台任务按知识库取出它们插进图里
            models.Index(fields=["knowledge_base"], name="document_chunks_pending_idx",
                         condition=Q(ann_pending=True)),
            *[hnsw_index(dim) for dim in SUPPORTED_DIMENSIONS],
        ]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.chunk_index}"


class KnowledgeDomain(models.Model):
    """一个知识库里某个 domain 的导入状态：版本号与内容摘要都没变时，导入直接跳过这个 domain。"""

    class Status(models.TextChoices):
        INITIALIZED = "initialized", "已初始化"
        FAILED = "failed", "部分失败"

    id = models.BigAutoField(primary_key=True)
    # 唯一约束 (knowledge_base, domain) 的索引以 knowledge_base_id 开头，外键不另建单列索引
    knowledge_base = models.ForeignKey(
        KnowledgeBase, on_delete=models.CASCADE, related_name="domains", verbose_name="知识库", db_index=False
    )
    domain = models.CharField("领域", max_length=255)
    version = models.CharField("版本", max_length=64)
    content_hash = models.CharField("内容摘要", max_length=64)
    status = models.CharField("状态", max_length=16, choices=Status.choices)
    item_count = models.PositiveIntegerField("条目数", default=0)
    # 最近一次同步的统计（created/updated/unchanged/removed/failed、chunks_embedded/reused、seconds）
    stats = models.JSONField("最近一次统计", default=dict, blank=True)
    synced_at = models.DateTimeField("同步时间", auto_now=True)

    class Meta:
        db_table = "knowledge_domains"
        verbose_name = "知识领域"
        verbose_name_plural = "知识领域"
        ordering = ["domain"]
        constraints = [
            models.UniqueConstraint(fields=["knowledge_base", "domain"], name="knowledge_domains_kb_domain_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.domain} v{self.version}"
