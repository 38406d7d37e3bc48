"""文档的 HTTP 接口。"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiRequest, extend_schema
from rest_framework import status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from documents import selectors, services
from documents.api.serializers import (
    JSON_FORM_ENCODING,
    DocumentAcceptedSerializer,
    DocumentListQuerySerializer,
    DocumentSerializer,
    DocumentUploadSerializer,
)
from documents.uploads import payload_too_large
from infra.api import MULTIPART_SLACK, error_responses, page_response, query_values
from infra.principal import request_principal


class KnowledgeBaseDocumentsView(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema(
        tags=["documents"], operation_id="upload_document", summary="上传文档（异步摄取）",
        request={"multipart/form-data": OpenApiRequest(
            DocumentUploadSerializer, encoding={"metadata": JSON_FORM_ENCODING, "chunking": JSON_FORM_ENCODING})},
        responses={202: DocumentAcceptedSerializer, **error_responses(403, 404, 413, 415)},
    )
    def post(self, request: Request, kb_id: str) -> Response:
        # 先校验知识库（存在 → 可用 → 权限），再读请求体
        kb = services.writable_knowledge_base(principal=request_principal(request), kb_id=kb_id)
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
        if declared > settings.MAX_DOCUMENT_SIZE + MULTIPART_SLACK:
            raise payload_too_large(settings.MAX_DOCUMENT_SIZE)
        body = DocumentUploadSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        upload = body.validated_data["file"]
        document = services.document_upload(
            kb=kb,
            filename=upload.name,
            upload=upload,
            metadata=body.validated_data.get("metadata", {}),
            chunking=body.validated_data.get("chunking", {}),
        )
        return Response(
            {"document_id": str(document.id), "knowledge_base_id": str(kb.id), "filename": document.filename,
             "status": document.status},
            status=status.HTTP_202_ACCEPTED,
        )

    @extend_schema(
        tags=["documents"], operation_id="list_documents", summary="列出知识库下的文档",
        parameters=[DocumentListQuerySerializer],
        responses={200: page_response(DocumentSerializer, "DocumentPage"), **error_responses(403, 404)},
    )
    def get(self, request: Request, kb_id: str) -> Response:
        query = DocumentListQuerySerializer(data=query_values(request.query_params))
        query.is_valid(raise_exception=True)
        params = query.validated_data
        _, items, total = selectors.document_list(
            principal=request_principal(request), kb_id=kb_id, page=params["page"],
            page_size=params["page_size"], statuses=params.get("status"),
        )
        return Response({"items": DocumentSerializer(items, many=True).data, "total": total,
                         "page": params["page"], "page_size": params["page_size"]})


class DocumentDetailView(APIView):
    @extend_schema(tags=["documents"], operation_id="get_document", summary="文档详情与摄取状态",
                   responses={200: DocumentSerializer, **error_responses(403, 404)})
    def get(self, request: Request, document_id: str) -> Response:
        document = selectors.document_get(principal=request_principal(request), document_id=document_id)
        return Response(DocumentSerializer(document).data)

    @extend_schema(tags=["documents"], operation_id="delete_document", summary="删除文档及其分块与向量",
                   request=None, responses={204: None, **error_responses(403, 404, 410)})
    def delete(self, request: Request, document_id: str) -> Response:
        services.document_delete(principal=request_principal(request), document_id=document_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DocumentReindexView(APIView):
    @extend_schema(tags=["documents"], operation_id="reindex_document",
                   summary="重新索引（旧分块在新分块提交前保持可检索）",
                   request=None, responses={202: DocumentSerializer, **error_responses(403, 404, 409, 410)})
    def post(self, request: Request, document_id: str) -> Response:
        document = services.document_reindex(principal=request_principal(request), document_id=document_id)
        document.refresh_from_db()
        return Response(DocumentSerializer(document).data, status=status.HTTP_202_ACCEPTED)
