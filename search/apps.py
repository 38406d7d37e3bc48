from django.apps import AppConfig


class SearchConfig(AppConfig):
    """检索应用。"""

    name = "search"
    verbose_name = "检索"
