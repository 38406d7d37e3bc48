"""测试里代替 worker 执行作业：登记（不交给队列）后在本进程里跑一次尝试。"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from documents.ingestion import ingestion_submit
from documents.models import Document
from jobs.models import Job
from jobs.runner import run_job


def job_of(target: Any) -> Job:
    """对象（文档、清理任务）最近的一个作业。"""
    return Job.objects.filter(target_id=target.pk).latest("created_at")


def ingest_now(document: Document) -> Job:
    """为文档登记摄取作业，并像 worker 一样执行一次尝试；返回执行后的作业。"""
    with transaction.atomic():
        job = ingestion_submit(document, push=False)
    run_job(str(job.id))
    job.refresh_from_db()
    return job


def run_again(job: Job) -> Job:
    """不等重试时间，立即再执行一次（模拟到点的一次性调度）。"""
    Job.objects.filter(pk=job.pk).update(run_after=None)
    run_job(str(job.id))
    job.refresh_from_db()
    return job
