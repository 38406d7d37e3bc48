"""API key：只存 SHA-256 摘要，明文只在创建时显示一次。"""

from __future__ import annotations

import hashlib
import secrets
import uuid

from django.db import models

from knowledge.models import KnowledgeBase

KEY_PREFIX = "rag_"


def hash_key(raw_key: str) -> str:
    """密钥本身有 256 位随机熵，单次 SHA-256 即可抵御离线猜测，无需慢哈希。"""
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def generate_key() -> str:
    """生成新的明文密钥，形如 ``rag_<43 个 URL 安全字符>``。"""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class ApiKey(models.Model):
    """调用方的 API key 及其作用域。

    作用域两个维度：知识库范围（全部，或列出的若干个）与权限（只读 / 读写）。
    创建知识库需要“全部知识库 + 读写”的 key。
    """

    class Access(models.TextChoices):
        READ = "read", "只读"
        READ_WRITE = "read_write", "读写"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField("名称", max_length=128, unique=True)
    key_hash = models.CharField("密钥摘要", max_length=64, unique=True, editable=False)
    key_prefix = models.CharField("密钥前缀", max_length=12, editable=False,
                                  help_text="明文的前几位，便于辨认是哪把 key")
    access = models.CharField("权限", max_length=16, choices=Access.choices, default=Access.READ_WRITE)
    all_knowledge_bases = models.BooleanField("全部知识库", default=True)
    knowledge_bases = models.ManyToManyField(
        KnowledgeBase, blank=True, related_name="api_keys", verbose_name="限定知识库",
        help_text="仅当未勾选“全部知识库”时生效",
    )
    is_active = models.BooleanField("启用", default=True)
    created_at = models.DateTimeField("创建时间", auto_now_add=True)
    last_used_at = models.DateTimeField("最近使用", null=True, blank=True)

    class Meta:
        verbose_name = "API key"
        verbose_name_plural = "API keys"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.key_prefix}…)"

    def set_new_key(self) -> str:
        """生成并设置新密钥，返回明文（调用方负责只展示一次）。"""
        raw = generate_key()
        self.key_hash = hash_key(raw)
        self.key_prefix = raw[:10]
        return raw

    @property
    def can_write(self) -> bool:
        return self.access == self.Access.READ_WRITE


class RateLimitBucket(models.Model):
    """令牌桶的状态：每个 API key 一行（``key:<id>``），认证失败按客户端 IP 一行（``auth:<ip>``）。

    只由 :mod:`ops.ratelimit` 的一条 UPSERT 读写（补充 + 扣减在同一语句里，原子），没有 ORM 写路径。
    表是 UNLOGGED（见迁移 0004）：不写 WAL，崩溃后清空——桶的状态丢了无妨。
    """

    key = models.CharField(primary_key=True, max_length=128)
    tokens = models.FloatField()
    # 最近一次请求是否放行（UPSERT 的 RETURNING 据此判断，省一次往返）
    allowed = models.BooleanField(default=True)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "ops_rate_limit_buckets"
        verbose_name = "限流令牌桶"
        verbose_name_plural = "限流令牌桶"

    def __str__(self) -> str:
        return f"{self.key}: {self.tokens:.1f}"
