from django.apps import AppConfig


class KnowledgeConfig(AppConfig):
    """知识库应用。"""

    name = "knowledge"
    verbose_name = "知识库"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from knowledge.tasks import vector_index_schedule_refresh

        post_migrate.connect(vector_index_schedule_refresh, sender=self,
                             dispatch_uid="ragservice.vector_index_schedule_refresh")
