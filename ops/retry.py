"""后台任务的延迟重试：django-q2 没有按任务的退避，这里用一次性 Schedule 安排下一次尝试。"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone


def backoff_seconds(base: int, attempt: int) -> int:
    """第 attempt 次尝试失败后的等待：base·2^(attempt-1)，即 1、2、4 倍……"""
    return int(base * 2 ** (attempt - 1))


def schedule_task(func: str, object_id: str, *, attempt: int, delay_seconds: float, request_id: str,
                  label: str) -> datetime:
    """安排 ``func(object_id, attempt=attempt, request_id=...)`` 在 delay 秒后执行，返回执行时间。"""
    from django_q.models import Schedule

    next_run = timezone.now() + timedelta(seconds=delay_seconds)
    Schedule.objects.create(
        name=f"{label}:{object_id}:{attempt}:{next_run.timestamp():.0f}",
        func=func,
        args=repr((object_id,)),
        kwargs=repr({"attempt": attempt, "request_id": request_id}),
        schedule_type=Schedule.ONCE,
        repeats=-1,
        next_run=next_run,
    )
    return next_run
