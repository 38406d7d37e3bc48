from django.urls import path

from documents.api import item_views, views

urlpatterns = [
    path("knowledge_bases/<str:kb_id>/documents", views.KnowledgeBaseDocumentsView.as_view(),
         name="knowledge-base-documents"),
    path("documents/<str:document_id>", views.DocumentDetailView.as_view(), name="document-detail"),
    path("documents/<str:document_id>/reindex", views.DocumentReindexView.as_view(), name="document-reindex"),
    # bulk 在单个条目之前：外部 id 为 "bulk" 的条目不能用这个路径写入（见 README）
    path("knowledge_bases/<str:kb_id>/items/bulk", item_views.ItemBulkView.as_view(), name="items-bulk"),
    path("knowledge_bases/<str:kb_id>/items", item_views.ItemListView.as_view(), name="items"),
    path("knowledge_bases/<str:kb_id>/items/<path:external_id>", item_views.ItemDetailView.as_view(),
         name="item-detail"),
    path("knowledge_bases/<str:kb_id>/domains", item_views.DomainListView.as_view(), name="domains"),
    path("knowledge_bases/<str:kb_id>/domains/<str:domain>/sync", item_views.DomainSyncView.as_view(),
         name="domain-sync"),
]
