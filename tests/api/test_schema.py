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
    # 没有错误时服务端返回 null（schemathesis 曾报出 schema 只写了 string）
    assert schema["components"]["schemas"]["CleanupTask"]["properties"]["error_message"]["nullable"] is True


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


def _request_schema(schema: dict, path: str, method: str) -> dict:
    content = schema["paths"][path][method]["requestBody"]["content"]
    ref = next(iter(content.values()))["schema"]["$ref"]
    return schema["components"]["schemas"][ref.rsplit("/", 1)[1]]


def _parameters(schema: dict, path: str, method: str) -> dict[str, dict]:
    return {p["name"]: p["schema"] for p in schema["paths"][path][method].get("parameters", [])}


def test_request_bodies_that_reject_unknown_fields_say_so(schema):
    """StrictSerializer 拒绝未知字段，schema 用 additionalProperties: false 写明（含嵌套对象）。"""
    requests = {name: body for name, body in schema["components"]["schemas"].items() if name.endswith("Request")}
    assert requests
    for name, body in requests.items():
        assert body.get("additionalProperties") is False, name


def test_enums_and_bounds_match_the_server(schema, settings):
    patch = _request_schema(schema, "/knowledge_bases/{kb_id}", "patch")
    status_enum = schema["components"]["schemas"][patch["properties"]["status"]["$ref"].rsplit("/", 1)[1]]
    assert status_enum["enum"] == ["enabled", "disabled"]
    search = _request_schema(schema, "/search", "post")["properties"]
    assert (search["top_k"]["minimum"], search["top_k"]["maximum"]) == (1, settings.MAX_TOP_K)
    assert (search["min_score"]["minimum"], search["min_score"]["maximum"]) == (0, 1)
    for path in ("/knowledge_bases", "/knowledge_bases/{kb_id}/documents", "/knowledge_bases/{kb_id}/items"):
        params = _parameters(schema, path, "get")
        assert (params["page"]["minimum"], params["page"]["maximum"]) == (1, 1_000_000), path
        assert (params["page_size"]["minimum"], params["page_size"]["maximum"]) == (1, settings.MAX_PAGE_SIZE), path
    for path in ("/knowledge_bases", "/knowledge_bases/{kb_id}/documents"):
        assert "pattern" in _parameters(schema, path, "get")["status"], path


def test_string_fields_exclude_what_the_server_rejects(schema):
    """DRF 的 CharField 拒绝 NUL；不允许空白的字段还拒绝全是空白的值——pattern 与之一致。"""
    import re

    search = _request_schema(schema, "/search", "post")["properties"]
    query = re.compile(search["query"]["pattern"])
    assert query.search("合同 条款") and not query.search("a\x00b") and not query.search("  \t")
    description = re.compile(_request_schema(schema, "/knowledge_bases", "post")["properties"]["description"]
                             ["pattern"])
    assert description.search("  ") and description.search("") and not description.search("\x00")
    status = re.compile(_parameters(schema, "/knowledge_bases", "get")["status"]["pattern"])
    assert status.search("enabled, deleted") and not status.search("enabled,") and not status.search("gone")


def test_schema_maximum_follows_settings(settings):
    settings.MAX_TOP_K = 7
    out = io.StringIO()
    call_command("spectacular", stdout=out)
    search = yaml.safe_load(out.getvalue())["components"]["schemas"]["SearchRequestRequest"]["properties"]
    assert search["top_k"]["maximum"] == 7
