"""接口契约的边界：分页上限、请求体大小与嵌套深度、超长 URL 与请求头（issue 12 第 1、2、9 条）。"""

from __future__ import annotations

import pytest

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
