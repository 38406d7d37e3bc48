"""知识条目与 domain 同步的 HTTP 接口：校验输入 → 调一个服务/查询 → 序列化输出。"""

from __future__ import annotations

from collections import Counter

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from documents import items as services
from documents import selectors
from documents.api.item_serializers import (
    DomainSerializer,
    DomainSyncResultSerializer,
    DomainSyncSerializer,
    ItemBulkResponseSerializer,
    ItemBulkSerializer,
    ItemEntrySerializer,
    ItemListQuerySerializer,
    ItemSerializer,
    ItemWriteResultSerializer,
    ItemWriteSerializer,
    bulk_result_payload,
    item_input,
    item_payload,
    write_result_payload,
)
from documents.domains import domain_sync
from documents.items import ItemResult
from documents.models import KnowledgeDomain
from infra.api import error_responses, page_response, query_values
from infra.errors import ApplicationError, ErrorCode, ErrorDetail, validation_error
from infra.principal import request_principal
from knowledge.selectors import usable_knowledge_base

_WRITE_STATUS = {"created": status.HTTP_201_CREATED, "queued": status.HTTP_202_ACCEPTED}


class ItemDetailView(APIView):
    @extend_schema(
        tags=["items"], operation_id="upsert_item",
        summary="按外部 id 写入知识条目（201 新建 / 200 更新或未变 / 202 大条目入队）",
        description="内容（正文 + 元数据 + 分块参数）的摘要没变：不做任何工作，result=unchanged。"
                    "变了：重新分块，只有文本变了的分块重新 embedding，新旧分块在一个事务里替换。"
                    "不超过 RAG_ITEM_SYNC_MAX_CHUNKS（默认 8）个分块时同步完成，否则 202 + result=queued，"
                    "用 GET 查看 status/reindex_status。"
                    "embedding 暂时不可用 → 503（带 Retry-After），旧版本照常可检索。",
        request=ItemWriteSerializer,
        responses={200: ItemWriteResultSerializer, 201: ItemWriteResultSerializer, 202: ItemWriteResultSerializer,
                   **error_responses(403, 404, 502, 503)},
    )
    def put(self, request: Request, kb_id: str, external_id: str) -> Response:
        kb = usable_knowledge_base(principal=request_principal(request), kb_id=kb_id, write=True)
        body = ItemWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        result = services.item_upsert(kb=kb, item=item_input(body.validated_data, external_id))
        return Response(write_result_payload(result), status=_WRITE_STATUS.get(result.result, status.HTTP_200_OK))

    @extend_schema(tags=["items"], operation_id="get_item", summary="知识条目详情",
                   responses={200: ItemSerializer, **error_responses(403, 404)})
    def get(self, request: Request, kb_id: str, external_id: str) -> Response:
        kb = usable_knowledge_base(principal=request_principal(request), kb_id=kb_id, write=False)
        return Response(item_payload(selectors.item_get(kb=kb, external_id=external_id)))

    @extend_schema(tags=["items"], operation_id="delete_item", summary="删除知识条目（分块立即从检索中消失）",
                   request=None, responses={204: None, **error_responses(403, 404)})
    def delete(self, request: Request, kb_id: str, external_id: str) -> Response:
        kb = usable_knowledge_base(principal=request_principal(request), kb_id=kb_id, write=True)
        services.item_delete(kb=kb, external_id=external_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ItemListView(APIView):
    @extend_schema(
        tags=["items"], operation_id="list_items", summary="按元数据过滤列出知识条目（不带查询的 search_knowledge）",
        parameters=[ItemListQuerySerializer],
        responses={200: page_response(ItemSerializer, "ItemPage"), **error_responses(403, 404)},
    )
    def get(self, request: Request, kb_id: str) -> Response:
        kb = usable_knowledge_base(principal=request_principal(request), kb_id=kb_id, write=False)
        query = ItemListQuerySerializer(data=query_values(request.query_params))
        query.is_valid(raise_exception=True)
        params = query.validated_data
        items, total = selectors.item_list(kb=kb, filters=query.filters(), page=params["page"],
                                           page_size=params["page_size"])
        return Response({"items": [item_payload(d) for d in items], "total": total, "page": params["page"],
                         "page_size": params["page_size"]})


class ItemBulkView(APIView):
    @extend_schema(
        tags=["items"], operation_id="bulk_upsert_items", summary="批量写入知识条目（逐条结果，embedding 跨条目合批）",
        description="每个条目一个结果：created / updated / unchanged / failed（附错误码与消息）；"
                    "一个条目不合法或失败不影响其他条目。批量写入总是同步完成。",
        request=ItemBulkSerializer, responses={200: ItemBulkResponseSerializer, **error_responses(403, 404)},
    )
    def post(self, request: Request, kb_id: str) -> Response:
        kb = usable_knowledge_base(principal=request_principal(request), kb_id=kb_id, write=True)
        body = ItemBulkSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        results: dict[int, ItemResult] = {}
        valid: dict[int, services.ItemInput] = {}
        seen: set[str] = set()
        for index, raw in enumerate(body.validated_data["items"]):
            entry = ItemEntrySerializer(data=raw)
            if not entry.is_valid():
                results[index] = ItemResult(raw.get("external_id"), "failed", error=validation_error(entry.errors))
            elif entry.validated_data["external_id"] in seen:
                results[index] = ItemResult(entry.validated_data["external_id"], "failed", error=ApplicationError(
                    ErrorCode.VALIDATION_ERROR, "Duplicate external_id in this request", 400,
                    [ErrorDetail("external_id", "DUPLICATE", "Each external_id may appear once per request")]))
            else:
                seen.add(entry.validated_data["external_id"])
                valid[index] = item_input(entry.validated_data)
        for index, result in zip(valid, services.item_bulk_upsert(kb=kb, items=list(valid.values())), strict=True):
            results[index] = result
        payload = [bulk_result_payload(index, results[index]) for index in sorted(results)]
        return Response({"results": payload, "counts": dict(Counter(r["result"] for r in payload))})


class DomainListView(APIView):
    @extend_schema(tags=["items"], operation_id="list_domains", summary="各 domain 的初始化状态、版本与最近一次统计",
                   responses={200: DomainSerializer(many=True), **error_responses(403, 404)})
    def get(self, request: Request, kb_id: str) -> Response:
        kb = usable_knowledge_base(principal=request_principal(request), kb_id=kb_id, write=False)
        return Response(DomainSerializer(KnowledgeDomain.objects.filter(knowledge_base=kb), many=True).data)


class DomainSyncView(APIView):
    @extend_schema(
        tags=["items"], operation_id="sync_domain", summary="整体同步一个 domain 的条目（版本与内容未变则跳过）",
        request=DomainSyncSerializer, responses={200: DomainSyncResultSerializer, **error_responses(403, 404)},
    )
    def post(self, request: Request, kb_id: str, domain: str) -> Response:
        kb = usable_knowledge_base(principal=request_principal(request), kb_id=kb_id, write=True)
        body = DomainSyncSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        stats = domain_sync(kb=kb, domain=domain, version=data["version"],
                            items=[item_input(entry) for entry in data["items"]], dry_run=data["dry_run"])
        return Response(stats.as_dict())
