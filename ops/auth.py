"""Bearer API key 鉴权：明文 key → ``infra.principal.Principal``。

调用方身份与作用域判定本身在 ``infra.principal``（各应用的服务层依赖它）；这里只管 key 的查验、
``last_used_at`` 的节流写入与认证失败的限流。
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from infra.principal import SYSTEM_PRINCIPAL, Principal
from infra.routers import fetchall_prepared
from ops.models import ApiKey, hash_key
from ops.ratelimit import auth_failure_allowed, retry_after_seconds

# last_used_at 的写入节流：避免每个请求都写一次数据库
_LAST_USED_RESOLUTION = timedelta(minutes=1)


# 按摘要读一把启用的 key 与它限定的知识库 id（一行）。鉴权在每个请求的路径上：限定的知识库 id 用子查询收进同一行
# （少一次往返），语句预备好、不经 ORM——ORM 每次编译这条带聚合的查询要约 0.5 ms，执行只要几十微秒
# （bench/pages/e2e_search.md，2026-11-30 的“当前数字”）
_KEY_SQL = (
    "SELECT k.id, k.name, k.access, k.all_knowledge_bases, k.last_used_at,"
    " ARRAY(SELECT m.knowledgebase_id FROM ops_apikey_knowledge_bases m WHERE m.apikey_id = k.id)"
    " FROM ops_apikey k WHERE k.key_hash = %s::text AND k.is_active"
)


def principal_for_key(raw_key: str) -> Principal | None:
    """明文 key → 调用方身份；无效或已吊销返回 None。HTTP 鉴权与 ``manage.py mcp --api-key`` 共用。

    读主库：吊销立即生效，不看副本的复制延迟。
    """
    rows = fetchall_prepared(connections[DEFAULT_DB_ALIAS], _KEY_SQL, [hash_key(raw_key.strip())])
    if not rows:
        return None
    key_id, name, access, all_knowledge_bases, last_used_at, scoped_kb_ids = rows[0]
    now = timezone.now()
    if last_used_at is None or now - last_used_at > _LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key_id).update(last_used_at=now)
    return Principal(
        name=name,
        can_write=access == ApiKey.Access.READ_WRITE,
        all_knowledge_bases=all_knowledge_bases,
        knowledge_base_ids=frozenset(scoped_kb_ids),
        key_id=key_id,
    )


def _authentication_failed(request: Request, message: str) -> exceptions.APIException:
    """一次认证失败：通常是 401；同一 IP 失败太多次（猜 key）则是 429 + Retry-After。"""
    decision = auth_failure_allowed(request)
    if not decision.allowed:
        return exceptions.Throttled(wait=retry_after_seconds(decision),
                                    detail="Too many failed authentication attempts from this address")
    return exceptions.AuthenticationFailed(message)


class ApiKeyAuthentication(BaseAuthentication):
    """``Authorization: Bearer <key>``；密钥按 SHA-256 摘要查找。"""

    def authenticate(self, request: Request) -> tuple[Principal, Principal] | None:
        if not settings.AUTH_ENABLED:
            return SYSTEM_PRINCIPAL, SYSTEM_PRINCIPAL
        header = request.headers.get("Authorization", "")
        if not header:
            return None
        scheme, _, raw_key = header.partition(" ")
        if scheme.lower() != "bearer" or not raw_key.strip():
            raise _authentication_failed(request, "Authorization header must be 'Bearer <api key>'")
        principal = principal_for_key(raw_key)
        if principal is None:
            raise _authentication_failed(request, "Invalid or revoked API key")
        return principal, principal

    def authenticate_header(self, request: Request) -> str:
        # 有这个头，DRF 才会对未认证请求返回 401 而不是 403
        return 'Bearer realm="ragservice"'


class HasApiKey(BasePermission):
    """要求请求已通过 API key 认证。"""

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, Principal)
