"""schemathesis 按 live schema 生成请求：每个响应都不是 5xx，且符合 schema（issue 12 Build 8）；
服务端与 schema 一样严格、也一样宽松——schema 不允许的请求被拒绝，schema 允许的请求被接受（issue 23）。"""

from __future__ import annotations

import json
from collections import Counter

import jsonschema
import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, assume
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from infra.errors import ApplicationError
from knowledge.models import KnowledgeBase
from knowledge.options import ITEM_CHUNKING_DEFAULTS, chunking_options
from ops.models import ApiKey
from ragservice.wsgi import application

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
# 每个操作的例子数与有状态场景数：合计 1000 个以上请求，在 2 核的开发机上约两分钟
EXAMPLES_PER_OPERATION = 40
STATEFUL_SCENARIOS = 50
# serial：schemathesis 按操作展开的测试共用一个节点 id，pytest-xdist 分发不了（每个只会跑一次），最后的
# test_enough_cases_were_generated 也要看到整个文件的请求数；scripts/test.sh 把它们放在一个进程里另跑
pytestmark = [pytest.mark.slow, pytest.mark.serial]
# 按操作统计实际发出的请求数（含有状态场景里的每一步）
CASES: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _in_process_app(settings):
    """直接调用 WSGI 应用（同一线程、同一个测试事务）。像 Django 的测试客户端那样，请求结束时不关闭数据库连接，
    否则第一个请求就会把测试事务所在的连接关掉。限流关掉：这里要测的是契约，不是 429。"""
    settings.RATE_LIMIT_ENABLED = False
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def auth_headers(db) -> dict[str, str]:
    key = ApiKey(name="schemathesis")
    raw = key.set_new_key()
    key.save()
    return {"Authorization": f"Bearer {raw}"}


# 收集测试时从应用自己的 /api/schema/ 取 schema（live schema，不是仓库里的静态文件）
schema = schemathesis.openapi.from_wsgi("/api/schema/", application)


@schema.parametrize()
@hypothesis_settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck),
                     database=None)
@pytest.mark.django_db
def test_every_operation(case, auth_headers):
    CASES[case.operation.label] += 1
    # 每个例子在保存点里跑、之后回滚：例子之间互不影响，hypothesis 收缩时可复现
    savepoint = transaction.savepoint()
    try:
        response = case.call(headers=auth_headers)
    finally:
        transaction.savepoint_rollback(savepoint)
    case.validate_response(response, checks=CHECKS)


@pytest.mark.django_db
def test_stateful_workflows(auth_headers):
    """按 schema 里的链接（schemathesis 由响应与参数推断）串起操作：创建知识库 → 查询/修改/上传/检索/删除……"""

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        # 每个场景在自己的保存点里跑、结束时回滚：场景之间不共享数据，hypothesis 重放与收缩时结果可复现
        def setup(self):
            self.savepoint = transaction.savepoint()

        def teardown(self):
            transaction.savepoint_rollback(self.savepoint)

        def get_call_kwargs(self, case):
            CASES["stateful " + case.operation.label] += 1
            return {"headers": auth_headers}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=CHECKS)

    Workflow.run(settings=hypothesis_settings(max_examples=STATEFUL_SCENARIOS, stateful_step_count=8, deadline=None,
                                              suppress_health_check=list(HealthCheck), database=None))


def test_enough_cases_were_generated():
    """整个文件一起跑时（CI 里总是这样）至少生成 1000 个请求；只挑部分测试跑时跳过。"""
    operations = {label for label in CASES if not label.startswith("stateful ")}
    if len(operations) < len(list(schema.get_all_operations())) or not any(
            label.startswith("stateful ") for label in CASES):
        pytest.skip("only part of tests/api/test_schemathesis.py ran")
    assert sum(CASES.values()) >= 1000, CASES


# ---------------------------------------------------------------- 与 schema 一样严格、一样宽松（issue 23）
# 外部探测（13,672 个请求）找到的几类不一致，这两个测试各自都能找到：
# * schema 拒绝、服务端接受（negative_data_rejection）：数字传给字符串字段（name、query、tags 的元素……）、
#   字符串 "0.5" 传给 min_score、0/1 传给布尔字段——DRF 的字段会“好心”转换；
# * schema 接受、服务端拒绝（positive_data_acceptance）：允许空串的字段被写成 oneOf[原 schema, 空串]，
#   空串两边都满足、oneOf 不成立（name_contains=""）；批量写入 items: [] 没有 minItems: 1；上传的
#   metadata / chunking 是 JSON 文本，schema 却写成任意字符串。
# 用一个真实的知识库做路径参数：否则大多数请求在校验之前就以 404 结束（两个检查都把 404 当作合理的回答），
# 请求体的问题根本到不了校验那一步。各用一份 schema，只生成反例或只生成正例
STRICT_EXAMPLES_PER_OPERATION = 40
negative_schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
negative_schema.config.generation.update(modes=[GenerationMode.NEGATIVE])
# 413 / 414 / 431：反例太大（请求体、URI、请求头超过 RAG_MAX_*），同样是拒绝，且都在 schema 的错误响应里
negative_schema.config.checks.negative_data_rejection.expected_statuses = [
    *negative_schema.config.checks.negative_data_rejection.expected_statuses, "413", "414", "431"]
positive_schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
# NUL 的拒绝写在 pattern 里，但 schemathesis 默认仍会往字符串里插 NUL（为了找 500）；自由结构的元数据里的
# NUL 也无法用 schema 描述。这里只关心 schema 描述得了的约束
positive_schema.config.generation.update(modes=[GenerationMode.POSITIVE], allow_x00=False)
# 415：上传的文件格式不受支持（schema 里文件就是 format: binary，格式是运行时判定的）
positive_schema.config.checks.positive_data_acceptance.expected_statuses = [
    *positive_schema.config.checks.positive_data_acceptance.expected_statuses, "415"]


@pytest.fixture
def real_kb(db) -> KnowledgeBase:
    return KnowledgeBase.objects.create(name="schemathesis-strict")


def _negative(case, location: ParameterLocation) -> bool:
    component = case.meta.components.get(location)
    return component is not None and component.mode.is_negative


def _call_on_real_kb(case, auth_headers: dict[str, str], kb: KnowledgeBase):
    """路径里的 kb_id 换成真实知识库，带上 API key，在保存点里调用、之后回滚。

    反例改的就是路径参数或请求头（如去掉了 Authorization）时保持原样，不把反例改回正例。
    """
    if "kb_id" in (case.path_parameters or {}) and not _negative(case, ParameterLocation.PATH):
        case.path_parameters["kb_id"] = str(kb.id)
    savepoint = transaction.savepoint()
    try:
        return case.call(headers=None if _negative(case, ParameterLocation.HEADER) else auth_headers)
    finally:
        transaction.savepoint_rollback(savepoint)


def _within_schema_expressible_rules(case, kb: KnowledgeBase) -> bool:
    """OpenAPI 3.0 的 schema 表达不了的两类规则（都写在字段说明里），不满足的正例不算数：

    * 分块参数的跨字段约束（overlap < chunk_size、parent_size >= chunk_size）：判定用服务端同一个函数，
      叠加的层次也与服务端相同；
    * 指定的 embedding 提供方与模型是否装在这台服务器上（运行时的事实，不是请求格式）。

    另外跳过空文件的上传：werkzeug 的测试客户端（schemathesis 直接调 WSGI 应用时用它）把空文件编码成
    少一个 CRLF 的 multipart，Django 读不到这个文件（真实客户端与 requests 编码的空文件照常 202）。
    """
    body = case.body if isinstance(case.body, dict) else {}
    if body.get("embedding"):
        return False
    file = body.get("file")
    if file is not None and not getattr(file, "data", file):
        return False
    upload = case.operation.label.endswith("/documents")
    for name, base in (("chunking", [kb.chunking] if upload else []), ("item_chunking", [ITEM_CHUNKING_DEFAULTS])):
        if isinstance(body.get(name), dict):
            try:
                chunking_options(*base, body[name])
            except ApplicationError:
                return False
    return True


@negative_schema.parametrize()
@hypothesis_settings(max_examples=STRICT_EXAMPLES_PER_OPERATION, deadline=None,
                     suppress_health_check=list(HealthCheck), database=None)
@pytest.mark.django_db
def test_server_rejects_what_the_schema_rejects(case, auth_headers, real_kb, fake_embedder):
    # multipart 里值为空列表的字段编码后整个消失（没有一个 part），服务端收到的是没有这个字段的合法请求
    body = case.body if isinstance(case.body, dict) else {}
    assume(not (str(case.media_type).startswith("multipart/") and any(value == [] for value in body.values())))
    response = _call_on_real_kb(case, auth_headers, real_kb)
    case.validate_response(response, checks=[not_a_server_error, negative_data_rejection])


@positive_schema.parametrize()
@hypothesis_settings(max_examples=STRICT_EXAMPLES_PER_OPERATION, deadline=None,
                     suppress_health_check=list(HealthCheck), database=None)
@pytest.mark.django_db
def test_server_accepts_what_the_schema_accepts(case, auth_headers, real_kb, fake_embedder):
    assume(_within_schema_expressible_rules(case, real_kb))
    response = _call_on_real_kb(case, auth_headers, real_kb)
    case.validate_response(response, checks=[not_a_server_error, positive_data_acceptance])


# 生成式测试不一定恰好生成空串：schemathesis 的 coverage 阶段不把 "" 当作 oneOf 的反例，它自己的校验器还会先
# 化简 schema（探测里 name_contains="" 是 13,672 个请求才撞上的）。这里对每个字符串查询参数与 JSON 请求体的
# 顶层字符串字段确定性地送 ""（与全空白），两种判定都必须与服务端一致：schemathesis 解析 live schema 得到的
# 校验器，以及按 OpenAPI 3.0 的原文（JSON Schema draft 4，Python 的 jsonschema）判定——任何客户端看到的都是原文
BLANKS = ("", " ")
BASE_BODIES = {
    "create_knowledge_base": {"name": "boundary"},
    "update_knowledge_base": {},
    "search": {"knowledge_base_id": "{kb_id}", "query": "q"},
    "upsert_item": {"content": "c"},
    "sync_domain": {"version": "1", "items": []},
}


def _inline_refs(node):
    """把 ``#/components/schemas/...`` 引用就地展开（这些 schema 没有自引用）。"""
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline_refs(positive_schema.raw_schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]])
        return {key: _inline_refs(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline_refs(value) for value in node]
    return node


def _verdicts(component, raw_schema: dict, value) -> dict[str, bool]:
    return {"schemathesis": component.is_valid(value),
            "draft4": jsonschema.Draft4Validator(_inline_refs(raw_schema)).is_valid(value)}


@pytest.mark.django_db
def test_blank_strings_are_judged_alike_by_schema_and_server(client_rw, real_kb, fake_embedder):
    path_values = {"kb_id": str(real_kb.id), "external_id": "boundary", "domain": "d"}
    checked = []
    for result in positive_schema.get_all_operations():
        operation = result.ok()
        path = operation.path.format(**{p.name: path_values.get(p.name, "x") for p in operation.path_parameters})
        strings = [p for p in operation.query if p.definition.get("schema", {}).get("type") == "string"
                   or "anyOf" in p.definition.get("schema", {}) or "oneOf" in p.definition.get("schema", {})]
        for parameter, value in ((p, v) for p in strings for v in BLANKS):
            response = client_rw.get(path, {parameter.name: value})
            accepted = response.status_code == 200
            verdicts = _verdicts(parameter, parameter.definition["schema"], value)
            assert set(verdicts.values()) == {accepted}, (operation.label, parameter.name, repr(value), verdicts,
                                                          response.status_code, response.content)
            checked.append((operation.label, parameter.name))
        raw = operation.definition.raw
        base = BASE_BODIES.get(raw.get("operationId"))
        body_schema = next((b for b in operation.body if b.media_type == "application/json"), None)
        if base is None or body_schema is None:
            continue
        raw_body = _inline_refs(raw["requestBody"]["content"]["application/json"]["schema"])
        names = [name for name, prop in raw_body.get("properties", {}).items() if prop.get("type") == "string"]
        for name, value in ((n, v) for n in names for v in BLANKS):
            body = {**{key: item.format(**path_values) if isinstance(item, str) else item
                       for key, item in base.items()}, name: value}
            savepoint = transaction.savepoint()
            try:
                response = client_rw.generic(operation.method.upper(), path, json.dumps(body),
                                             content_type="application/json")
            finally:
                transaction.savepoint_rollback(savepoint)
            accepted = not (response.status_code == 400 and any(
                detail["field"] == name for detail in response.json()["error"]["details"]))
            verdicts = _verdicts(body_schema, raw_body, body)
            assert set(verdicts.values()) == {accepted}, (operation.label, name, repr(value), verdicts,
                                                          response.status_code, response.content)
            checked.append((operation.label, name))
    # 确实检查到了：列表的过滤参数与几个请求体的字符串字段
    assert ("GET /knowledge_bases", "name_contains") in checked
    assert ("POST /knowledge_bases", "description") in checked
    assert ("PUT /knowledge_bases/{kb_id}/items/{external_id}", "content") in checked
