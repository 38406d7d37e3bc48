from django.urls import path

from documents.api import views

urlpatterns = [
    path("knowledge_bases/<str:kb_id>/documents", views.KnowledgeBaseDocumentsView.as_view(),
         name="knowledge-base-documents"),
    path("documents/<str:document_id>", views.DocumentDetailView.as_view(), name="document-detail"),
    path("documents/<str:document_id>/reindex", views.DocumentReindexView.as_view(), name="document-reindex"),
]
