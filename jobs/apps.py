from django.apps import AppConfig


class JobsConfig(AppConfig):
    """后台作业：一张作业表与一个执行器（租约、心跳、退避重试、worker 死亡判定、回到正确的队列）。"""

    name = "jobs"
    verbose_name = "后台作业"
