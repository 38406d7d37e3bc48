"""探针与指标：不需要 API key（供编排系统与 Prometheus 抓取）。"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from infra import metrics
from infra.api import ERROR_SCHEMA
from infra.errors import DATABASE_RETRY_AFTER_SECONDS, ApplicationError, ErrorCode, ErrorDetail
from ops.selectors import DatabaseGaugeCollector, readiness, warm_engines


class _PublicView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]


class HealthView(_PublicView):
    """存活探针：进程能响应即可，不做任何 I/O。"""

    @extend_schema(
        tags=["ops"],
        operation_id="health",
        responses=inline_serializer("Health", {"status": serializers.CharField()}),
    )
    def get(self, request: Request) -> Response:
        return Response({"status": "ok"})


class ReadyView(_PublicView):
    """就绪探针：数据库可达、pgvector 已安装、迁移已应用、django-q2 worker 在线且已加载模型。

    200 时另有 ``warm``：按进程种类（``web``、``worker``）列出已预热的引擎，见 :func:`ops.selectors.warm_engines`。
    503 的响应体是统一错误格式，不带它。
    """

    @extend_schema(
        tags=["ops"],
        operation_id="ready",
        responses={
            200: inline_serializer(
                "Ready",
                {"status": serializers.CharField(), "checks": serializers.DictField(child=serializers.DictField()),
                 "warm": serializers.DictField(
                     child=serializers.DictField(child=serializers.ListField(child=serializers.CharField())),
                     help_text="按进程种类（web：答这次请求的 web 进程；worker：每个已预热的后台 worker 都有的）"
                               "列出已预热的引擎：embedding_query、embedding_batch、ocr、rerank，"
                               "各是“提供方:模型”的列表（OCR 是引擎名）。任务在 web 进程里同步执行时没有 worker 一项")},
            ),
            503: OpenApiResponse(ERROR_SCHEMA, description="未就绪：details 列出失败的检查项"),
        },
    )
    def get(self, request: Request) -> Response:
        results = readiness()
        failed = [r for r in results if not r.ok]
        if failed:
            raise ApplicationError(
                ErrorCode.SERVICE_UNAVAILABLE,
                "Service is not ready: " + ", ".join(r.name for r in failed),
                503,
                [ErrorDetail(r.name, "CHECK_FAILED", r.detail) for r in failed],
                headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
            )
        return Response({"status": "ready", "checks": {r.name: {"ok": r.ok, "detail": r.detail} for r in results},
                         "warm": warm_engines()})


class MetricsView(_PublicView):
    """Prometheus 文本格式的指标。"""

    @extend_schema(exclude=True)
    def get(self, request: Request) -> HttpResponse:
        if not settings.METRICS_ENABLED:
            raise ApplicationError(ErrorCode.NOT_FOUND, "Metrics are disabled (RAG_METRICS_ENABLED=false)", 404)
        body, content_type = metrics.render_latest(DatabaseGaugeCollector())
        return HttpResponse(body, content_type=content_type)
