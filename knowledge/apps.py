from django.apps import AppConfig


class KnowledgeConfig(AppConfig):
    """知识库应用。"""

    name = "knowledge"
    verbose_name = "知识库"
