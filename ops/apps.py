from django.apps import AppConfig


class OpsConfig(AppConfig):
    """运维应用。"""

    name = "ops"
    verbose_name = "运维"
