from django.apps import AppConfig


class DocumentsConfig(AppConfig):
    """文档应用。"""

    name = "documents"
    verbose_name = "文档"

    def ready(self) -> None:
        # 摄取模块导入时加载模型，只能在应用注册表就绪之后导入（AppConfig.ready 的约定）
        from documents.ingestion import INGEST_JOB
        from jobs.runner import register

        register(INGEST_JOB)
