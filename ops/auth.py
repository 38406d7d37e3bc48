"""Bearer API key 鉴权与作用域判定。

校验顺序遵循规范：存在性（404）→ 可用性（403/410/409）→ 权限（403）。因此这里只负责
“是谁、能做什么”，具体资源的权限判定由服务层在前两步之后调用 ``authorize_*``。
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import Q
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ragservice.errors import ApplicationError, ErrorCode

# last_used_at 的写入节流：避免每个请求都写一次数据库
_LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class Principal:
    """一次请求的调用方身份与作用域。"""

    name: str
    can_write: bool
    all_knowledge_bases: bool
    knowledge_base_ids: frozenset[UUID] = field(default_factory=frozenset)
    is_authenticated: bool = True
    # 限流按 key 计；系统身份（admin、管理命令、关闭鉴权）没有 key，不限流
    key_id: UUID | None = None

    def can_access(self, knowledge_base_id: UUID) -> bool:
        return self.all_knowledge_bases or knowledge_base_id in self.knowledge_base_ids


# 关闭鉴权（仅开发模式）时的调用方，也用于 admin 与管理命令这类可信入口
SYSTEM_PRINCIPAL = Principal(name="system", can_write=True, all_knowledge_bases=True)


def _permission_denied(message: str) -> ApplicationError:
    return ApplicationError(ErrorCode.PERMISSION_DENIED, message, 403)


def authorize_knowledge_base(principal: Principal, knowledge_base_id: UUID, *, write: bool) -> None:
    """在存在性与可用性校验之后调用：key 的作用域不含该知识库或缺少写权限时抛 403。"""
    if not principal.can_access(knowledge_base_id):
        raise _permission_denied("API key is not allowed to access this knowledge base")
    if write and not principal.can_write:
        raise _permission_denied("API key is read-only")


def authorize_global_write(principal: Principal) -> None:
    """创建知识库这类不针对单个知识库的写操作，需要“全部知识库 + 读写”的 key。"""
    if not (principal.all_knowledge_bases and principal.can_write):
        raise _permission_denied("Creating knowledge bases requires a read/write key scoped to all knowledge bases")


def principal_for_key(raw_key: str) -> Principal | None:
    """明文 key → 调用方身份；无效或已吊销返回 None。HTTP 鉴权与 ``manage.py mcp --api-key`` 共用。"""
    from ops.models import ApiKey, hash_key

    # 限定的知识库 id 聚合进同一条查询（不用 prefetch 的第二条）：鉴权在每个请求的路径上，少一次数据库往返
    key = (
        ApiKey.objects.filter(key_hash=hash_key(raw_key.strip()), is_active=True)
        .annotate(scoped_kb_ids=ArrayAgg("knowledge_bases__id", filter=Q(knowledge_bases__isnull=False)))
        .first()
    )
    if key is None:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > _LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return Principal(
        name=key.name,
        can_write=key.can_write,
        all_knowledge_bases=key.all_knowledge_bases,
        knowledge_base_ids=frozenset(key.scoped_kb_ids or ()),
        key_id=key.id,
    )


def _authentication_failed(request: Request, message: str) -> exceptions.APIException:
    """一次认证失败：通常是 401；同一 IP 失败太多次（猜 key）则是 429 + Retry-After。"""
    from ops.ratelimit import auth_failure_allowed, retry_after_seconds

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


def request_principal(request: Request) -> Principal:
    """视图取当前调用方；HasApiKey 已保证其存在。"""
    assert isinstance(request.auth, Principal)
    return request.auth
