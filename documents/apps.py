from django.apps import AppConfig


class DocumentsConfig(AppConfig):
    """文档应用。"""

    name = "documents"
    verbose_name = "文档"
