"""文档与分块的数据模型。

分块表只有一个 ``embedding`` 列，但每个知识库使用自己的 embedding 模型，维度可能不同
（multilingual-e5-small 384 维、BGE-M3 1024 维）。做法：列不固定维度，另存 ``embedding_dim``，
用 CHECK 约束保证二者一致，再为每个支持的维度建一个“表达式 + 部分”HNSW 索引
（``(embedding::vector(N)) vector_cosine_ops WHERE embedding_dim = N``）。
检索时按知识库的维度带上同样的 cast 与条件即可命中对应索引，不同模型的向量永不混用。
"""

from __future__ import annotations

import uuid

from django.contrib.postgres.indexes import OpClass
from django.db import models
from django.db.models import Q
from django.db.models.functions import Cast
from pgvector.django import HnswIndex, VectorField

from knowledge.models import KnowledgeBase

# 有 HNSW 索引的向量维度；新增维度需要一个新的迁移
SUPPORTED_DIMENSIONS = (384, 768, 1024)
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64


def _hnsw_index(dim: int) -> HnswIndex:
    return HnswIndex(
        OpClass(Cast("embedding", VectorField(dimensions=dim)), name="vector_cosine_ops"),
        name=f"document_chunks_hnsw_{dim}",
        m=HNSW_M,
        ef_construction=HNSW_EF_CONSTRUCTION,
        condition=Q(embedding_dim=dim),
    )


class Document(models.Model):
    """上传到知识库的一份文档；``deleted`` 是墓碑状态，用来区分“已删除”与“从未存在”。"""

    class Status(models.TextChoices):
        PROCESSING = "processing", "处理中"
        COMPLETED = "completed", "已完成"
        FAILED = "failed", "失败"
        DELETED = "deleted", "已删除"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    knowledge_base = models.ForeignKey(
        KnowledgeBase, on_delete=models.CASCADE, related_name="documents", verbose_name="知识库"
    )
    filename = models.CharField("文件名", max_length=512)
    status = models.CharField("状态", max_length=16, choices=Status.choices, default=Status.PROCESSING)
    error_message = models.TextField("错误信息", blank=True, default="")
    chunk_count = models.PositiveIntegerField("分块数", default=0)
    metadata = models.JSONField("元数据", default=dict, blank=True)
    created_at = models.DateTimeField("创建时间", auto_now_add=True)
    updated_at = models.DateTimeField("更新时间", auto_now=True)

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
        ]
        indexes = [models.Index(fields=["knowledge_base", "status"], name="documents_kb_status_idx")]

    def __str__(self) -> str:
        return self.filename


class DocumentChunk(models.Model):
    """文档的一个分块及其向量（L2 归一化后存储）。"""

    id = models.BigAutoField(primary_key=True)
    knowledge_base = models.ForeignKey(
        KnowledgeBase, on_delete=models.CASCADE, related_name="chunks", verbose_name="知识库"
    )
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks", verbose_name="文档")
    chunk_index = models.PositiveIntegerField("序号")
    chunk_text = models.TextField("文本")
    metadata = models.JSONField("元数据", default=dict, blank=True)
    embedding = VectorField("向量", null=True, blank=True)
    embedding_dim = models.PositiveSmallIntegerField("向量维度", null=True, blank=True)
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
            *[_hnsw_index(dim) for dim in SUPPORTED_DIMENSIONS],
        ]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.chunk_index}"
