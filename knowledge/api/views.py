"""知识库与清理任务的 HTTP 接口：校验输入 → 调一个服务/查询 → 序列化输出。"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from infra.api import error_responses, page_response, query_values
from infra.principal import request_principal
from knowledge import selectors, services
from knowledge.api.serializers import (
    CleanupTaskSerializer,
    KnowledgeBaseCreateSerializer,
    KnowledgeBaseDeletedSerializer,
    KnowledgeBaseListQuerySerializer,
    KnowledgeBaseSerializer,
    KnowledgeBaseUpdateSerializer,
)


class KnowledgeBaseListView(APIView):
    @extend_schema(
        tags=["knowledge_bases"],
        operation_id="list_knowledge_bases", summary="列出知识库",
        parameters=[KnowledgeBaseListQuerySerializer],
        responses={200: page_response(KnowledgeBaseSerializer, "KnowledgeBasePage"), **error_responses()},
    )
    def get(self, request: Request) -> Response:
        query = KnowledgeBaseListQuerySerializer(data=query_values(request.query_params))
        query.is_valid(raise_exception=True)
        params = query.validated_data
        items, total = selectors.knowledge_base_list(
            principal=request_principal(request),
            page=params["page"],
            page_size=params["page_size"],
            name_contains=params.get("name_contains"),
            statuses=params.get("status"),
        )
        return Response({
            "items": KnowledgeBaseSerializer(items, many=True).data,
            "total": total,
            "page": params["page"],
            "page_size": params["page_size"],
        })

    @extend_schema(
        tags=["knowledge_bases"],
        operation_id="create_knowledge_base", summary="创建知识库",
        request=KnowledgeBaseCreateSerializer,
        responses={201: KnowledgeBaseSerializer, **error_responses(403, 409)},
    )
    def post(self, request: Request) -> Response:
        body = KnowledgeBaseCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        kb = services.knowledge_base_create(principal=request_principal(request), **body.validated_data)
        kb = selectors.knowledge_base_fetch(kb_id=kb.id)
        return Response(KnowledgeBaseSerializer(kb).data, status=status.HTTP_201_CREATED)


class KnowledgeBaseDetailView(APIView):
    @extend_schema(tags=["knowledge_bases"], operation_id="get_knowledge_base",
                   summary="知识库详情（含已删除，供审计）",
                   responses={200: KnowledgeBaseSerializer, **error_responses(403, 404)})
    def get(self, request: Request, kb_id: str) -> Response:
        kb = selectors.knowledge_base_get(principal=request_principal(request), kb_id=kb_id)
        return Response(KnowledgeBaseSerializer(kb).data)

    @extend_schema(
        tags=["knowledge_bases"],
        operation_id="update_knowledge_base", summary="修改名称、描述或状态（enabled/disabled）",
        request=KnowledgeBaseUpdateSerializer,
        responses={200: KnowledgeBaseSerializer, **error_responses(403, 404, 409)},
    )
    def patch(self, request: Request, kb_id: str) -> Response:
        body = KnowledgeBaseUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        kb = services.knowledge_base_update(
            principal=request_principal(request), kb_id=kb_id, changes=dict(body.validated_data)
        )
        return Response(KnowledgeBaseSerializer(kb).data)

    @extend_schema(
        tags=["knowledge_bases"],
        operation_id="delete_knowledge_base", summary="删除知识库（立即标记 deleted，异步清理）",
        request=None,
        responses={202: KnowledgeBaseDeletedSerializer, **error_responses(403, 404, 409)},
    )
    def delete(self, request: Request, kb_id: str) -> Response:
        task = services.knowledge_base_delete(principal=request_principal(request), kb_id=kb_id)
        return Response(
            {"knowledge_base_id": str(task.knowledge_base_id), "status": "deleted", "cleanup_task_id": str(task.id)},
            status=status.HTTP_202_ACCEPTED,
        )


class CleanupTaskDetailView(APIView):
    @extend_schema(tags=["cleanup_tasks"], operation_id="get_cleanup_task", summary="清理任务状态与进度",
                   responses={200: CleanupTaskSerializer, **error_responses(403, 404)})
    def get(self, request: Request, task_id: str) -> Response:
        task = selectors.cleanup_task_get(principal=request_principal(request), task_id=task_id)
        return Response(CleanupTaskSerializer(task).data)


class CleanupTaskRetryView(APIView):
    @extend_schema(tags=["cleanup_tasks"], operation_id="retry_cleanup_task", summary="重试失败的清理任务",
                   request=None, responses={202: CleanupTaskSerializer, **error_responses(403, 404, 409)})
    def post(self, request: Request, task_id: str) -> Response:
        task = services.cleanup_task_retry(principal=request_principal(request), task_id=task_id)
        task.refresh_from_db()
        return Response(CleanupTaskSerializer(task).data, status=status.HTTP_202_ACCEPTED)
