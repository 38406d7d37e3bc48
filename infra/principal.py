"""调用方身份（``Principal``）与作用域判定。

校验顺序遵循错误契约：存在性（404）→ 可用性（403/410/409）→ 权限（403）。因此这里只负责
“是谁、能做什么”，具体资源的权限判定由服务层在前两步之后调用 ``authorize_*``。
身份从哪里来（API key、管理后台、管理命令）是 ``ops.auth`` 的事；各应用的服务层只依赖这里。
"""

from __future__ import annotations

from dataclasses import dataclass, field
from uuid import UUID

from rest_framework.request import Request

from infra.errors import ApplicationError, ErrorCode


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


def request_principal(request: Request) -> Principal:
    """视图取当前调用方；HasApiKey 已保证其存在。"""
    assert isinstance(request.auth, Principal)
    return request.auth
