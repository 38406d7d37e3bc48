"""schemathesis 按 live schema 生成请求：每个响应都不是 5xx，且符合 schema（issue 12 Build 8）。"""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ops.models import ApiKey
from ragservice.wsgi import application

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
# 每个操作的例子数与有状态场景数：合计 1000 个以上请求，在 2 核的开发机上约两分钟
EXAMPLES_PER_OPERATION = 40
STATEFUL_SCENARIOS = 50
pytestmark = pytest.mark.slow
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
