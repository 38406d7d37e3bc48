"""后台作业的记录（NetBox ``core.Job`` 的形状）：做什么（kind）、对谁做（target）、在哪个队列、做到哪一步了。

一行作业是一段要做完的工作：文档的摄取或重新索引、知识库删除后的清理。它与工作的对象分开：文档行只描述文档
（上传、条目、当前状态与给用户看的说明），尝试次数、租约、心跳、重试时间、worker 死亡次数都在这里，由
``jobs.runner`` 独自读写。同一个对象同一时刻至多一个未结束（queued / running）的作业，由部分唯一索引保证。
"""

from __future__ import annotations

import uuid
from datetime import datetime
from functools import cached_property
from typing import Any

from django.db import models
from django.db.models import Q


class Job(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", "排队中"
        RUNNING = "running", "运行中"
        COMPLETED = "completed", "已完成"
        FAILED = "failed", "失败"
        CANCELLED = "cancelled", "已取消"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # 作业种类（ingest、cleanup）：执行器按它找到登记的处理者（jobs.runner.register）
    kind = models.CharField("种类", max_length=32)
    # 对象的 id（文档、清理任务）。不用外键：作业表在应用之下一层，不认识上层的模型
    target_id = models.UUIDField("对象")
    knowledge_base_id = models.UUIDField("知识库", null=True, blank=True)
    # django-q2 集群名：重试、回收、停止后放回，都回到这里记下的队列
    queue = models.CharField("队列", max_length=64)
    status = models.CharField("状态", max_length=16, choices=Status.choices, default=Status.QUEUED)
    # 已开始的尝试数（执行器取得租约时加一；停止、让位放回时减回去，不算一次尝试）
    attempt = models.PositiveSmallIntegerField("尝试次数", default=0)
    # 租约过期未续（执行它的 worker 被杀、OOM、掉电）的次数：到 MAX_WORKER_DEATHS 即判定工作本身有害
    worker_deaths = models.PositiveSmallIntegerField("worker 意外退出次数", default=0)
    # 运行中又有人要求再做一次（条目在处理期间又被写入）：这次做完后回到队列，而不是结束
    rerun = models.BooleanField("做完再做一次", default=False)
    run_after = models.DateTimeField("下次自动重试", null=True, blank=True)
    pushed_at = models.DateTimeField("最近一次交给队列", null=True, blank=True)
    lease_owner = models.CharField("租约持有者", max_length=64, blank=True, default="")
    lease_expires_at = models.DateTimeField("租约到期", null=True, blank=True)
    heartbeat_at = models.DateTimeField("最近心跳", null=True, blank=True)
    error = models.TextField("最近的错误", blank=True, default="")
    request_id = models.CharField("发起请求 ID", max_length=64, blank=True, default="")
    created_at = models.DateTimeField("创建时间", auto_now_add=True)
    updated_at = models.DateTimeField("更新时间", auto_now=True)
    started_at = models.DateTimeField("开始时间", null=True, blank=True)
    finished_at = models.DateTimeField("结束时间", null=True, blank=True)

    class Meta:
        db_table = "jobs"
        verbose_name = "后台作业"
        verbose_name_plural = "后台作业"
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["queued", "running", "completed", "failed", "cancelled"]),
                name="jobs_status_valid",
            ),
            # 运行中的作业必有租约：回收器只凭“租约过期”判断执行者已死
            models.CheckConstraint(condition=~Q(status="running") | ~Q(lease_owner=""), name="jobs_running_leased"),
            models.UniqueConstraint(fields=["target_id"], condition=Q(status__in=["queued", "running"]),
                                    name="jobs_one_open_per_target"),
        ]
        indexes = [
            models.Index(fields=["target_id", "created_at"], name="jobs_target_idx"),
            # 回收器每分钟按状态找过期租约与久未交给队列的作业
            models.Index(fields=["status", "lease_expires_at"], name="jobs_status_lease_idx"),
            # 知识库清理完成时删掉它的作业记录
            models.Index(fields=["knowledge_base_id"], name="jobs_kb_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.target_id} ({self.status})"

    @property
    def is_open(self) -> bool:
        return self.status in OPEN


OPEN = (Job.Status.QUEUED, Job.Status.RUNNING)


class JobTarget:
    """作业对象（文档、清理任务）的模型混入：API 与管理后台里的“尝试次数”“下次自动重试”来自它最近的作业。

    ``job`` 按需查一次；列表页由调用方一次取齐后填进去（``jobs.runner.latest_jobs``），不必每行一条查询。
    """

    pk: Any

    @cached_property
    def job(self) -> Job | None:
        return Job.objects.filter(target_id=self.pk).order_by("-created_at").first()

    def _attempts(self) -> int:
        """最近一轮已开始的尝试次数。"""
        return self.job.attempt if self.job is not None else 0

    def _next_retry_at(self) -> datetime | None:
        """排队等自动重试时的重试时间；不在等重试时为 None。"""
        job = self.job
        return job.run_after if job is not None and job.status == Job.Status.QUEUED else None

    # 管理后台按 fget.short_description 给属性列起名
    _attempts.short_description = "本轮尝试次数"  # type: ignore[attr-defined]
    _next_retry_at.short_description = "下次自动重试"  # type: ignore[attr-defined]
    attempts = property(_attempts)
    next_retry_at = property(_next_retry_at)
