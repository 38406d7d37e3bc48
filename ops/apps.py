from django.apps import AppConfig


class OpsConfig(AppConfig):
    """运维应用。"""

    name = "ops"
    verbose_name = "运维"

    def ready(self) -> None:
        # 注册 OpenAPI 鉴权扩展（导入即注册）
        from django.core.signals import got_request_exception
        from django_q.signals import post_spawn

        from ops import schema  # noqa: F401
        from ragservice.errors import log_request_exception

        # Django 层的未处理异常（非 DRF 视图、其他中间件）都会发出该信号，在这里统一记录堆栈；
        # DRF 视图的异常由 exception_handler 自行记录，不会走到这里
        got_request_exception.connect(log_request_exception, dispatch_uid="ragservice.log_request_exception")
        # django-q2 的每个 worker 子进程启动时先加载模型与 OCR 引擎（见 ops.warmup）
        from ops.warmup import warm_worker

        post_spawn.connect(warm_worker, dispatch_uid="ragservice.warm_worker")
