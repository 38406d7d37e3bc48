"""按 API key 限流（令牌桶），按客户端 IP 限制认证失败次数，以及管理后台登录的失败次数（见 ops.admin_login）。

桶的状态默认放在 PostgreSQL（``ops_rate_limit_buckets``，每个请求一条 UPSERT：按流逝时间补充、
扣一个令牌、记下是否放行，全部在一条语句里完成，多个 web 进程并发也不会超发）；设置了
``RAG_REDIS_URL`` 时改用 Redis（一段 Lua 脚本，同样原子）。两者的语义相同：容量 burst，
每秒补充 rate 个，放行扣 1，拒绝不扣，并给出下一个令牌到来的秒数作为 Retry-After。
``cost`` 为负数时是还回令牌（总是放行，至多补到 burst），如登录成功后清空失败计数。
"""

from __future__ import annotations

# redis 在函数里导入：只在配置了 RAG_REDIS_URL 时需要。
import itertools
import math
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

from django.conf import settings
from django.db import connection
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from infra.principal import Principal
from infra.routers import fetchall_prepared


@dataclass(frozen=True)
class Decision:
    """一次取令牌的结果；``retry_after`` 是拒绝时到下一个令牌的秒数（放行时为 0）。"""

    allowed: bool
    retry_after: float


def _decision(allowed: bool, tokens: float, rate: float) -> Decision:
    return Decision(allowed, 0.0 if allowed else max(0.0, (1.0 - tokens) / rate))


class BucketStore(Protocol):
    """令牌桶的存储：一次调用补充并尝试扣 ``cost`` 个令牌（默认 1；负数即还回），必须原子。"""

    def take(self, key: str, *, rate: float, burst: int, cost: int = 1) -> Decision: ...


class PostgresBucketStore:
    """PostgreSQL 里的令牌桶：每个请求一条 UPSERT。

    EXCLUDED.updated_at 是本条语句取的同一个时刻；用 clock_timestamp() 而不是 now()，免得在外层事务里
    （如测试）每次都拿到事务开始的时间、桶永远不补充。
    """

    # cost = 1 时与“够一个就扣一个”相同；cost <= 0 时条件恒真，LEAST 把还回的令牌封顶在 burst。
    # 每个请求一次：预备语句（服务端绑定参数，所以参数都写明类型），省掉每次的解析与规划
    sql = """
INSERT INTO ops_rate_limit_buckets AS b (key, tokens, allowed, updated_at)
VALUES (%(key)s::text, LEAST(%(burst)s::float8, %(burst)s::float8 - %(cost)s::float8), true, clock_timestamp())
ON CONFLICT (key) DO UPDATE SET
    tokens = CASE WHEN {refill} >= %(cost)s::float8 THEN LEAST(%(burst)s::float8, {refill} - %(cost)s::float8)
                  ELSE {refill} END,
    allowed = {refill} >= LEAST(%(cost)s::float8, 1),
    updated_at = EXCLUDED.updated_at
RETURNING b.tokens, b.allowed
""".format(refill="LEAST(%(burst)s::float8, b.tokens + %(rate)s::float8 * "
                  "GREATEST(0, EXTRACT(EPOCH FROM EXCLUDED.updated_at - b.updated_at)))")

    # 每个进程每这么多次取令牌顺手删一次闲置的桶（按 IP 的认证失败桶否则只增不减）
    prune_every = 1000
    # 闲置这么久的桶早已装满（容量 / 速率远小于此），删掉与保留等价
    prune_idle = "1 hour"

    def __init__(self) -> None:
        self._takes = itertools.count(1)

    def take(self, key: str, *, rate: float, burst: int, cost: int = 1) -> Decision:
        [(tokens, allowed)] = fetchall_prepared(connection, self.sql,
                                                {"key": key, "rate": rate, "burst": burst, "cost": cost})
        if next(self._takes) % self.prune_every == 0:
            with connection.cursor() as cursor:
                cursor.execute("DELETE FROM ops_rate_limit_buckets WHERE updated_at < clock_timestamp() - %s::interval",
                               [self.prune_idle])
        return _decision(bool(allowed), float(tokens), rate)


# KEYS[1] 桶；ARGV: rate, burst, cost。用 Redis 服务器的时钟，多个 web 进程之间没有时钟偏差
_REDIS_SCRIPT = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local ts = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local allowed = 0
if tokens >= cost then
  tokens = math.min(burst, tokens - cost)
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return {allowed, tostring(tokens)}
"""


class RedisBucketStore:
    """Redis 里的令牌桶：一段 Lua 脚本（原子）；桶在补满之后自动过期，不留垃圾键。"""

    prefix = "ragservice:ratelimit:"

    def __init__(self, url: str) -> None:
        import redis

        self._client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._script = self._client.register_script(_REDIS_SCRIPT)

    def take(self, key: str, *, rate: float, burst: int, cost: int = 1) -> Decision:
        allowed, tokens = self._script(keys=[self.prefix + key], args=[rate, burst, cost])
        return _decision(bool(int(allowed)), float(tokens), rate)


@cache
def _redis_store(url: str) -> RedisBucketStore:
    return RedisBucketStore(url)


_postgres_store = PostgresBucketStore()


def bucket_store() -> BucketStore:
    """按配置选存储：设置了 RAG_REDIS_URL 用 Redis，否则 PostgreSQL。"""
    if settings.REDIS_URL:
        return _redis_store(settings.REDIS_URL)
    return _postgres_store


def take_token(key: str, *, rate: float, burst: int) -> Decision:
    """从名为 ``key`` 的桶取一个令牌。"""
    return bucket_store().take(key, rate=rate, burst=burst)


def refill_bucket(key: str, *, rate: float, burst: int) -> None:
    """把名为 ``key`` 的桶补满（如登录成功后清空失败计数）。"""
    bucket_store().take(key, rate=rate, burst=burst, cost=-burst)


def retry_after_seconds(decision: Decision) -> int:
    """Retry-After 头的整数秒（向上取整，至少 1）。"""
    return max(1, math.ceil(decision.retry_after))


def client_ip(request: Any) -> str:
    """客户端地址。只用 REMOTE_ADDR：X-Forwarded-For 可由客户端伪造，不能用来绕过限流。"""
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def auth_failure_allowed(request: Any) -> Decision:
    """记一次认证失败；同一 IP 失败过多时返回拒绝（调用方回 429 而不是 401）。"""
    if not settings.RATE_LIMIT_ENABLED:
        return Decision(True, 0.0)
    return take_token(f"auth:{client_ip(request)}", rate=settings.RATE_LIMIT_AUTH_FAILURE_RATE,
                      burst=settings.RATE_LIMIT_AUTH_FAILURE_BURST)


class ApiKeyRateThrottle(BaseThrottle):
    """DRF 限流类：每个 API key 一个令牌桶；超限 → 429 RATE_LIMITED + Retry-After（见 infra.errors）。

    认证关闭（开发模式）或公开端点（/health 等，没有 API key）不限流。
    """

    def __init__(self) -> None:
        self.decision = Decision(True, 0.0)

    def allow_request(self, request: Request, view: Any) -> bool:
        principal = request.auth
        if not settings.RATE_LIMIT_ENABLED or not isinstance(principal, Principal) or principal.key_id is None:
            return True
        self.decision = take_token(f"key:{principal.key_id}", rate=settings.RATE_LIMIT_RATE,
                                   burst=settings.RATE_LIMIT_BURST)
        return self.decision.allowed

    def wait(self) -> float:
        return float(retry_after_seconds(self.decision))
