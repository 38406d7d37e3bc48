"""按 API key 的令牌桶限流、按 IP 的认证失败限制，以及管理页面的 CSP 头（issue 12 第 9 条、Build 7）。"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from rest_framework.test import APIClient

from ops.models import RateLimitBucket
from ops.ratelimit import PostgresBucketStore, RedisBucketStore
from tests.conftest import assert_error

pytestmark = pytest.mark.process


@pytest.fixture
def tight_limits(settings):
    settings.RATE_LIMIT_ENABLED = True
    settings.RATE_LIMIT_RATE = 0.001  # 测试期间基本不补充
    settings.RATE_LIMIT_BURST = 3
    settings.RATE_LIMIT_AUTH_FAILURE_RATE = 0.001
    settings.RATE_LIMIT_AUTH_FAILURE_BURST = 2
    return settings


@pytest.mark.django_db
def test_each_api_key_has_its_own_bucket(make_client, tight_limits):
    first, second = make_client(), make_client()
    for _ in range(3):
        assert first.get("/knowledge_bases").status_code == 200
    response = first.get("/knowledge_bases")
    error = assert_error(response, 429, "RATE_LIMITED")
    assert error["details"] == []
    assert int(response["Retry-After"]) >= 1
    assert second.get("/knowledge_bases").status_code == 200
    # 一个 key 一行，由一条 UPSERT 维护
    assert RateLimitBucket.objects.filter(key__startswith="key:").count() == 2


@pytest.mark.django_db
def test_public_endpoints_and_disabled_limits_are_not_counted(make_client, tight_limits):
    client = make_client()
    for _ in range(5):
        assert client.get("/health").status_code == 200
    tight_limits.RATE_LIMIT_ENABLED = False
    for _ in range(5):
        assert client.get("/knowledge_bases").status_code == 200
    assert not RateLimitBucket.objects.exists()


@pytest.mark.django_db
def test_failed_authentication_is_limited_per_client_ip(make_client, tight_limits):
    guesser = APIClient()
    guesser.credentials(HTTP_AUTHORIZATION="Bearer rag_guess")
    for _ in range(2):
        assert_error(guesser.get("/knowledge_bases"), 401, "UNAUTHORIZED")
    response = guesser.get("/knowledge_bases")
    assert_error(response, 429, "RATE_LIMITED")
    assert int(response["Retry-After"]) >= 1
    # 限的是失败次数：同一地址上的有效 key 照常可用；别的地址不受影响
    assert make_client().get("/knowledge_bases").status_code == 200
    assert_error(guesser.get("/knowledge_bases", REMOTE_ADDR="10.0.0.9"), 401, "UNAUTHORIZED")


def _concurrent_takes(store, key: str, *, workers: int, per_worker: int, burst: int) -> int:
    def run() -> int:
        try:
            return sum(store.take(key, rate=0.001, burst=burst).allowed for _ in range(per_worker))
        finally:
            connection.close()

    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(lambda _: run(), range(workers)))


@pytest.mark.django_db(transaction=True)
def test_postgres_bucket_never_overgrants_under_concurrency():
    """多个连接并发取同一个桶：放行数正好等于容量（补充 + 扣减在一条 UPSERT 里，原子）。"""
    allowed = _concurrent_takes(PostgresBucketStore(), "key:concurrent", workers=6, per_worker=15, burst=40)
    assert allowed == 40
    RateLimitBucket.objects.all().delete()


@pytest.mark.django_db
def test_postgres_bucket_refills_at_the_configured_rate():
    store = PostgresBucketStore()
    # 每秒 5 个：一个令牌 200 ms 才补回来，机器再忙，四次 take 之间也不会隔这么久
    # （以前每秒 50 个、20 ms，负载高时偶尔失败）
    assert [store.take("key:refill", rate=5.0, burst=2).allowed for _ in range(3)] == [True, True, False]
    denied = store.take("key:refill", rate=5.0, burst=2)
    assert not denied.allowed and 0 < denied.retry_after <= 0.2
    time.sleep(0.25)
    assert store.take("key:refill", rate=5.0, burst=2).allowed


@pytest.fixture
def redis_url(tmp_path):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not installed (apt-get install redis-server); Redis rate-limit store not tested")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                               "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_redis_bucket_is_atomic_and_refills(redis_url):
    store = RedisBucketStore(redis_url)
    allowed = _concurrent_takes(store, "key:concurrent", workers=6, per_worker=15, burst=40)
    assert allowed == 40
    assert [store.take("key:refill", rate=50.0, burst=1).allowed for _ in range(2)] == [True, False]
    time.sleep(0.05)
    assert store.take("key:refill", rate=50.0, burst=1).allowed


@pytest.mark.django_db
def test_redis_store_is_used_when_configured(make_client, tight_limits, redis_url):
    tight_limits.REDIS_URL = redis_url
    client = make_client()
    for _ in range(3):
        assert client.get("/knowledge_bases").status_code == 200
    assert_error(client.get("/knowledge_bases"), 429, "RATE_LIMITED")
    assert not RateLimitBucket.objects.exists()


def test_threads_do_not_share_a_redis_connection_state(redis_url):
    """同一个 RedisBucketStore 被多个请求线程共用（redis-py 的连接池是线程安全的）。"""
    store = RedisBucketStore(redis_url)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(store.take("key:t", rate=0.001, burst=4).allowed))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 4 + [True] * 4


@pytest.mark.django_db
def test_admin_and_playground_pages_send_a_content_security_policy(admin_client, client_rw):
    for url in ("/admin/", "/admin/login/", "/playground/"):
        policy = admin_client.get(url)["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "object-src 'none'" in policy and "frame-ancestors" in policy, url
    assert "Content-Security-Policy" not in client_rw.get("/knowledge_bases")


@pytest.mark.django_db
def test_bucket_table_is_unlogged():
    """桶是可丢的状态：UNLOGGED 表不写 WAL，每个请求的 UPSERT 不必等 WAL 刷盘。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT relpersistence FROM pg_class WHERE relname = 'ops_rate_limit_buckets'")
        assert cursor.fetchone() == ("u",)


@pytest.mark.django_db
def test_idle_buckets_are_pruned_now_and_then():
    store = PostgresBucketStore()
    store.prune_every = 3
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO ops_rate_limit_buckets VALUES "
                       "('auth:10.1.2.3', 5, true, now() - interval '2 hours')")
    store.take("key:a", rate=1.0, burst=5)
    store.take("key:a", rate=1.0, burst=5)
    assert RateLimitBucket.objects.filter(key="auth:10.1.2.3").exists()
    store.take("key:a", rate=1.0, burst=5)
    assert list(RateLimitBucket.objects.values_list("key", flat=True)) == ["key:a"]
