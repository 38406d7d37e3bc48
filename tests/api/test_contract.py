"""接口契约的边界：分页上限、请求体大小与嵌套深度、超长 URL 与请求头（issue 12 第 1、2、9 条）。"""

from __future__ import annotations

import io
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.conftest import assert_error

pytestmark = pytest.mark.django_db

HUGE = str(2**63 - 1)


@pytest.fixture
def list_urls(kb_factory):
    kb = kb_factory()
    return ["/knowledge_bases", f"/knowledge_bases/{kb.id}/documents", f"/knowledge_bases/{kb.id}/items"]


@pytest.mark.parametrize(("params", "field"), [
    ({"page": HUGE}, "page"), ({"page": "1000001"}, "page"), ({"page_size": HUGE}, "page_size"),
    ({"page": "-" + HUGE}, "page"),
])
def test_every_paginated_list_bounds_page_numbers(client_rw, list_urls, params, field):
    for url in list_urls:
        error = assert_error(client_rw.get(url, params), 400, "VALIDATION_ERROR")
        assert error["details"][0]["field"] == field, url


def test_last_allowed_page_is_an_empty_page(client_rw, list_urls):
    for url in list_urls:
        response = client_rw.get(url, {"page": "1000000", "page_size": "100"})
        assert response.status_code == 200, (url, response.content)
        assert response.json()["items"] == []


def test_page_size_maximum_follows_the_setting(client_rw, list_urls, settings):
    settings.MAX_PAGE_SIZE = 5
    assert_error(client_rw.get(list_urls[0], {"page_size": 6}), 400, "VALIDATION_ERROR")
    assert client_rw.get(list_urls[0], {"page_size": 5}).status_code == 200


def test_status_filter_accepts_exactly_what_the_schema_pattern_describes(client_rw):
    assert client_rw.get("/knowledge_bases", {"status": " enabled , deleted"}).status_code == 200
    for bad in ("enabled,", ",", "enabled,,disabled", "gone"):
        assert_error(client_rw.get("/knowledge_bases", {"status": bad}), 400, "VALIDATION_ERROR")


def _file() -> SimpleUploadedFile:
    return SimpleUploadedFile("a.txt", b"hello", content_type="text/plain")


def _post_json(client, url, raw: str):
    return client.post(url, data=raw, content_type="application/json")


@pytest.fixture
def small_body_limit(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def test_oversize_json_body_is_413(client_rw, kb_factory, small_body_limit):
    kb = kb_factory()
    raw = '{"query": "' + "x" * small_body_limit + '", "knowledge_base_id": "' + str(kb.id) + '"}'
    error = assert_error(_post_json(client_rw, "/search", raw), 413, "PAYLOAD_TOO_LARGE")
    assert error["details"][0]["code"] == "TOO_LARGE"
    assert_error(_post_json(client_rw, "/knowledge_bases", raw), 413, "PAYLOAD_TOO_LARGE")


def test_oversize_multipart_fields_are_413(client_rw, kb_factory, small_body_limit):
    kb = kb_factory()
    response = client_rw.post(f"/knowledge_bases/{kb.id}/documents",
                              {"file": _file(), "metadata": "x" * (small_body_limit + 1)}, format="multipart")
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")


DEEP = "[" * 100_000


@pytest.mark.parametrize("depth", [33, 2000, 100_000])
def test_deeply_nested_json_is_rejected_with_a_clear_code(client_rw, kb_factory, depth):
    kb = kb_factory()
    nested = "[" * depth + "]" * depth
    bodies = {
        "/search": '{"query": "x", "knowledge_base_id": "' + str(kb.id) + '", "filters": {"domain": ' + nested + "}}",
        "/knowledge_bases": '{"name": "n", "chunking": ' + nested + "}",
        f"/knowledge_bases/{kb.id}/items/bulk": '{"items": [{"external_id": "a", "content": "c", "metadata": '
                                                + nested + "}]}",
        "/mcp": '{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": ' + nested + "}",
    }
    for url, raw in bodies.items():
        error = assert_error(_post_json(client_rw, url, raw), 400, "VALIDATION_ERROR")
        assert error["details"][0]["code"] == "NESTING_TOO_DEEP", url
    unterminated = assert_error(_post_json(client_rw, "/search", DEEP), 400, "VALIDATION_ERROR")
    assert unterminated["details"][0]["code"] in ("NESTING_TOO_DEEP", "PARSE_ERROR")


def test_json_at_the_depth_limit_is_accepted(client_rw):
    nested = "[" * 31 + "1" + "]" * 31  # 加上外层的对象正好 32 层，由序列化器按字段规则判定
    raw = '{"name": "n", "chunking": ' + nested + "}"
    error = assert_error(_post_json(client_rw, "/knowledge_bases", raw), 400, "VALIDATION_ERROR")
    assert error["details"][0]["code"] != "NESTING_TOO_DEEP"


@pytest.mark.parametrize("field", ["metadata", "chunking"])
def test_deeply_nested_multipart_json_fields_are_rejected(client_rw, kb_factory, field):
    kb = kb_factory()
    response = client_rw.post(f"/knowledge_bases/{kb.id}/documents", {"file": _file(), field: DEEP},
                              format="multipart")
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert error["details"][0] == {"field": field, "code": "NESTING_TOO_DEEP",
                                   "message": "JSON nesting must not exceed 32 levels."}


def test_overlong_uri_is_414_in_the_error_schema(client_rw, settings):
    response = client_rw.get("/knowledge_bases", {"name_contains": "x" * settings.MAX_URL_LENGTH})
    error = assert_error(response, 414, "URI_TOO_LONG")
    assert error["details"][0]["code"] == "TOO_LONG"
    assert_error(client_rw.get("/knowledge_bases/" + "x" * 3000), 404, "KNOWLEDGE_BASE_NOT_FOUND")


def test_oversize_headers_are_431_in_the_error_schema(client_rw, settings):
    error = assert_error(client_rw.get("/knowledge_bases", HTTP_X_PADDING="x" * settings.MAX_HEADER_BYTES), 431,
                         "HEADERS_TOO_LARGE")
    assert error["details"][0]["code"] == "TOO_LARGE"
    assert client_rw.get("/knowledge_bases", HTTP_X_PADDING="x" * 8000).status_code == 200


def test_gunicorn_parse_errors_are_written_in_the_error_schema():
    """gunicorn 在解析阶段拒绝的请求（不经 Django）也回统一错误格式，而不是 HTML 页。"""
    import json
    import socket

    from gunicorn import util

    from ragservice import gunicorn_conf

    assert util.write_error is gunicorn_conf.write_json_error
    assert gunicorn_conf.limit_request_line >= settings_limit("MAX_URL_LENGTH")
    server, client = socket.socketpair()
    with server, client:
        gunicorn_conf.write_json_error(server, 414, "URI Too Long", "GET /" + "x" * 9000)
        server.shutdown(socket.SHUT_WR)
        raw = b""
        while chunk := client.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 414 URI Too Long") and b"Content-Type: application/json" in head
    error = json.loads(body)["error"]
    assert error["code"] == "URI_TOO_LONG" and error["details"] == [] and "xxx" not in error["message"]
    assert f"X-Request-ID: {error['request_id']}".encode() in head


def settings_limit(name: str) -> int:
    from django.conf import settings

    return int(getattr(settings, name))


@pytest.mark.django_db
def test_nul_inside_nested_metadata_keys_is_a_400_not_a_500(client_rw, kb_factory):
    """schemathesis 找到的：自由结构的元数据里，嵌套对象的键带 NUL，jsonb 存不了，写库时曾经 500。"""
    kb = kb_factory()
    body = {"content": "正文", "metadata": {"outer": [{"k\u0000ey": 1}]}}
    response = client_rw.put(f"/knowledge_bases/{kb.id}/items/a1", data=json.dumps(body),
                             content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["details"][0]["code"] == "NUL_CHARACTER"
    upload = client_rw.post(f"/knowledge_bases/{kb.id}/documents",
                            {"file": io.BytesIO(b"text"), "metadata": json.dumps({"a": {"b\u0000": "c"}})})
    assert upload.status_code == 400, upload.content
