"""检索的 HTTP 接口。"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from infra.api import error_responses
from infra.principal import request_principal
from search import services
from search.api.serializers import SearchRequestSerializer, SearchResultSerializer


def result_payload(result: services.SearchResult) -> dict[str, Any]:
    chunk = result.chunk
    item: dict[str, Any] = {
        "chunk_id": chunk.chunk_id,
        "chunk_text": chunk.text,
        "score": round(result.score, 6),
        "document_id": str(chunk.document_id),
        "filename": chunk.filename,
        "chunk_index": chunk.chunk_index,
        "metadata": chunk.metadata,
    }
    if result.parent_text is not None:
        item["parent_chunk_id"] = result.parent_chunk_id
        item["parent_text"] = result.parent_text
    return item


class SearchView(APIView):
    @extend_schema(
        tags=["search"], operation_id="search", summary="混合检索（向量 + 全文，RRF 融合，重排序）",
        request=SearchRequestSerializer,
        responses={
            200: OpenApiResponse(
                SearchResultSerializer(many=True),
                description="按 score 降序的结果数组（知识库无已完成文档时为空数组）。"
                            "Server-Timing 头给出各阶段耗时；发生降级时 X-Search-Degraded 头列出原因"
                            "（fulltext-only、vector-only、no-retrieval、rerank-unavailable）。",
            ),
            **error_responses(403, 404),
        },
    )
    def post(self, request: Request) -> Response:
        body = SearchRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        kb = services.searchable_knowledge_base(principal=request_principal(request),
                                                kb_id=body.validated_data["knowledge_base_id"])
        outcome = services.search(kb, body.to_request())
        response = Response([result_payload(result) for result in outcome.results])
        response["Server-Timing"] = outcome.server_timing()
        if outcome.degraded:
            response["X-Search-Degraded"] = ", ".join(outcome.degraded)
        return response
