"""管理后台登录的防暴力破解：按（用户名，客户端 IP）计失败次数。

同一用户名从同一地址在 RAG_ADMIN_LOGIN_WINDOW 秒内失败 RAG_ADMIN_LOGIN_MAX_FAILURES 次之后，再来的尝试——
密码正确也一样——都被拒绝（429，页面上写明多少秒后再试）。计数用限流的令牌桶（ops.ratelimit，PostgreSQL
或 Redis，多个 web 进程共享）：容量 N、每 WINDOW/N 秒补回一次机会，整个窗口过去后完全恢复；
登录成功则把桶补满（失败计数清零）。

每次尝试在校验密码之前先扣一个令牌：并发的猜测也不会超过 N 次；扣不到就根本不去校验密码。
"""

from __future__ import annotations

import hashlib
from typing import Any

import structlog
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse

from ops.ratelimit import client_ip, refill_bucket, retry_after_seconds, take_token

logger = structlog.get_logger("ops.admin_login")


def _limits() -> dict[str, Any]:
    failures = settings.ADMIN_LOGIN_MAX_FAILURES
    return {"rate": failures / settings.ADMIN_LOGIN_WINDOW, "burst": failures}


def login_bucket_key(username: str, request: HttpRequest | None) -> str:
    """桶名：用户名取摘要（长度有界、不把用户名原样写进限流表），加上客户端地址。"""
    digest = hashlib.sha256(username.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"admin-login:{digest}:{client_ip(request) if request is not None else 'unknown'}"


class ThrottledAdminAuthenticationForm(AdminAuthenticationForm):
    """管理后台的登录表单：失败次数过多时拒绝（见模块说明）。"""

    error_messages = {
        **AdminAuthenticationForm.error_messages,
        "throttled": "登录失败次数过多，请 %(seconds)d 秒后再试。",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # 被拒绝时到下一次可以尝试的秒数，视图据此回 429 + Retry-After
        self.retry_after: int | None = None

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username")
        if not username or not self.cleaned_data.get("password"):
            return super().clean()  # 字段没填：不是一次登录尝试，不计数
        key = login_bucket_key(username, self.request)
        decision = take_token(key, **_limits())
        if not decision.allowed:
            self.retry_after = retry_after_seconds(decision)
            logger.warning("admin_login_throttled", client_ip=client_ip(self.request),
                           retry_after=self.retry_after)
            raise ValidationError(self.error_messages["throttled"], code="throttled",
                                  params={"seconds": self.retry_after})
        cleaned = super().clean()  # 用户名或密码不对、不是管理员：抛 ValidationError，扣掉的令牌不还
        refill_bucket(key, **_limits())
        return cleaned


def admin_login(request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
    """``/admin/login/``：Django admin 自己的登录视图，被拒绝时状态码改为 429 并带 Retry-After。"""
    response = admin.site.login(request, extra_context)
    form = (getattr(response, "context_data", None) or {}).get("form")
    retry_after = getattr(form, "retry_after", None)
    if retry_after is not None:
        response.status_code = 429
        response["Retry-After"] = str(retry_after)
    return response
