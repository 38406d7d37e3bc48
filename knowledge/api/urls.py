from django.urls import path

from knowledge.api import views

# 路径中的 id 用 str 接收：非 UUID 的 id 同样按“资源不存在”返回各自的 404 错误码
urlpatterns = [
    path("knowledge_bases", views.KnowledgeBaseListView.as_view(), name="knowledge-base-list"),
    path("knowledge_bases/<str:kb_id>", views.KnowledgeBaseDetailView.as_view(), name="knowledge-base-detail"),
    path("cleanup_tasks/<str:task_id>", views.CleanupTaskDetailView.as_view(), name="cleanup-task-detail"),
    path("cleanup_tasks/<str:task_id>/retry", views.CleanupTaskRetryView.as_view(), name="cleanup-task-retry"),
]
