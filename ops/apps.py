from django.apps import AppConfig


class OpsConfig(AppConfig):
    """运维应用：API key 与鉴权、限流、管理后台首页、后台任务（清理、索引同步、回收）、探针与预热。"""

    name = "ops"
    verbose_name = "运维"

    def ready(self) -> None:
        # 这些模块导入时会加载模型（django_q 的信号模块也是），Django 只允许在应用注册表就绪之后导入：
        # 这是 AppConfig.ready 的约定，不是为了绕开循环导入。infra.schema 导入即注册 OpenAPI 鉴权扩展。
        from django.core.signals import got_request_exception
        from django.db.models.signals import post_migrate
        from django_q.signals import post_execute_in_worker, post_spawn, pre_execute

        from infra import schema  # noqa: F401
        from infra.errors import log_request_exception
        from infra.workers import on_task_finished, on_task_started, on_worker_ready, on_worker_spawn
        from jobs.runner import register
        from ops.cleanup import CLEANUP_JOB
        from ops.tasks import maintenance_schedule_refresh
        from ops.warmup import warm_worker

        # Django 层的未处理异常（非 DRF 视图、其他中间件）都会发出该信号，在这里统一记录堆栈；
        # DRF 视图的异常由 exception_handler 自行记录，不会走到这里
        register(CLEANUP_JOB)
        got_request_exception.connect(log_request_exception, dispatch_uid="ragservice.log_request_exception")
        # django-q2 的每个 worker 子进程启动时：先装上停止信号的处理（预热的二十秒里到达的停止也不会丢），
        # 再加载模型与 OCR 引擎（见 ops.warmup），加载完才在忙闲表上标为空闲（见 infra.workers；接收者按连接顺序调用）
        post_spawn.connect(on_worker_spawn, dispatch_uid="ragservice.worker_stop_handler")
        post_spawn.connect(warm_worker, dispatch_uid="ragservice.warm_worker")
        post_spawn.connect(on_worker_ready, dispatch_uid="ragservice.worker_ready")
        pre_execute.connect(on_task_started, dispatch_uid="ragservice.worker_task_started")
        post_execute_in_worker.connect(on_task_finished, dispatch_uid="ragservice.worker_task_finished")
        post_migrate.connect(maintenance_schedule_refresh, sender=self,
                             dispatch_uid="ragservice.maintenance_schedule_refresh")
