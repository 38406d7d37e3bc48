"""OpenAPI schema 是受测试的契约：无警告生成、通过校验、每个业务接口都声明统一错误格式。"""

from __future__ import annotations

import io

import pytest
import yaml
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db

EXPECTED = {
    "/knowledge_bases": {"get", "post"},
    "/knowledge_bases/{kb_id}": {"get", "patch", "delete"},
    "/cleanup_tasks/{task_id}": {"get"},
    "/cleanup_tasks/{task_id}/retry": {"post"},
    "/knowledge_bases/{kb_id}/documents": {"get", "post"},
    "/documents/{document_id}": {"get", "delete"},
    "/documents/{document_id}/reindex": {"post"},
    "/search": {"post"},
    "/knowledge_bases/{kb_id}/items": {"get"},
    "/knowledge_bases/{kb_id}/items/bulk": {"post"},
    "/knowledge_bases/{kb_id}/items/{external_id}": {"get", "put", "delete"},
    "/knowledge_bases/{kb_id}/domains": {"get"},
    "/knowledge_bases/{kb_id}/domains/{domain}/sync": {"post"},
    "/health": {"get"},
    "/ready": {"get"},
}


@pytest.fixture(scope="module")
def schema() -> dict:
    out = io.StringIO()
    # --fail-on-warn：任何 schema 生成警告都会让命令失败
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    return yaml.safe_load(out.getvalue())


def test_schema_paths_and_methods(schema):
    paths = {path: set(ops) - {"parameters"} for path, ops in schema["paths"].items()}
    assert paths == EXPECTED


def test_business_operations_use_error_schema_and_bearer_auth(schema):
    assert schema["components"]["securitySchemes"]["ApiKeyAuth"] == {
        "type": "http", "scheme": "bearer", "description": "Authorization: Bearer <API key>",
    }
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if path in ("/health", "/ready"):
                assert operation.get("security") in (None, [], [{}])  # [{}] 即“无需鉴权”
                continue
            assert {"ApiKeyAuth": []} in operation["security"], (path, method)
            for status in ("400", "401"):
                ref = operation["responses"][status]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorResponse"), (path, method, status)


def test_cleanup_progress_schema_is_documented(schema):
    progress = schema["components"]["schemas"]["Progress"]["properties"]
    assert set(progress) == {"processed", "total", "percentage"}
    assert progress["total"]["nullable"] is True and progress["percentage"]["nullable"] is True


def test_schema_and_swagger_ui_are_served_offline():
    client = Client()
    response = client.get("/api/schema/")
    assert response.status_code == 200
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    # Swagger UI 的静态资源来自 drf-spectacular-sidecar（本地），不依赖 CDN
    assert "drf_spectacular_sidecar/swagger-ui-dist" in html
    assert "cdn.jsdelivr" not in html


def test_migrations_are_in_sync():
    call_command("makemigrations", "--check", "--dry-run", stdout=io.StringIO())
