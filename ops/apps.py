from django.apps import AppConfig


class OpsConfig(AppConfig):
    """运维应用。"""

    name = "ops"
    verbose_name = "运维"

    def ready(self) -> None:
        # 注册 OpenAPI 鉴权扩展（导入即注册）
        from ops import schema  # noqa: F401
