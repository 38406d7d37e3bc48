"""RAG_* 环境变量的唯一解析入口。

每个配置项在 ``VARIABLES`` 中登记一次（名称、类型、默认值、说明），settings.py 只通过
``env_*`` 读取；README 的变量表也由同一份登记生成（``manage.py ragconfig --markdown``），
保证文档与代码不会走样。

非法取值（解析不了、越界、不在可选值里）的处理取决于运行模式（``RAG_ENV``，由 ``env_mode`` 最先解析）：
开发模式记录告警并回退默认值；生产模式不回退，settings 加载期间先把全部非法取值收集起来，
由 ``raise_invalid`` 一次报出（ImproperlyConfigured，逐条写明变量、取值与可接受的范围），运维一次改完。
生产模式下缺少密钥同样直接失败。
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

logger = logging.getLogger("infra.config")

T = TypeVar("T")


@dataclass(frozen=True)
class Variable:
    """一个已登记的环境变量；``default`` 为 None 表示“未设置时有特殊含义”。"""

    name: str
    kind: str
    default: Any
    help: str


VARIABLES: dict[str, Variable] = {}


def _register(name: str, kind: str, default: Any, help_text: str) -> None:
    # 同名重复登记说明代码里出现了两个含义可能不同的读取点，直接报错
    existing = VARIABLES.get(name)
    if existing is not None and (existing.kind, existing.default) != (kind, default):
        raise ImproperlyConfigured(f"{name} registered twice with different definitions")
    VARIABLES[name] = Variable(name, kind, default, help_text)


MODES = ("development", "production")


@dataclass
class _Validation:
    """非法取值的处理方式，由 ``env_mode`` 设定。"""

    production: bool = False
    # 生产模式下 settings 加载期间收集的非法取值；None 表示不在收集（生产模式下遇到即抛）
    pending: list[str] | None = None


_validation = _Validation()


def env_mode(help_text: str) -> str:
    """``RAG_ENV``：必须先于其他变量解析，它决定其余变量取值非法时是告警回退还是启动失败。

    它自己取值非法时两种模式都直接失败：回退到 development 会悄悄关掉生产模式的全部保护。
    """
    _register("RAG_ENV", "|".join(MODES), "development", help_text)
    raw = os.environ.get("RAG_ENV", "").strip()
    mode = raw.lower() or "development"
    if mode not in MODES:
        raise ImproperlyConfigured(f"RAG_ENV={raw} 不合法：{_one_of(MODES)}")
    _validation.production = mode == "production"
    _validation.pending = [] if _validation.production else None
    return mode


def raise_invalid() -> None:
    """settings.py 末尾调用：生产模式下把收集到的非法取值一次全部报出；此后再遇到非法取值即时失败。"""
    pending, _validation.pending = _validation.pending, None
    if pending:
        lines = "\n".join(f"  {problem}" for problem in pending)
        raise ImproperlyConfigured(f"RAG_ENV=production 下配置取值不合法（不回退默认值），拒绝启动：\n{lines}")


def _reject(problem: str) -> None:
    # 生产模式：加载 settings 期间先记下，其余时候直接失败
    if _validation.pending is None:
        raise ImproperlyConfigured(problem)
    _validation.pending.append(problem)


def _one_of(choices: tuple[str, ...]) -> str:
    return f"需要 {'、'.join(choices)} 之一"


def _range(noun: str, minimum: float | None, maximum: float | None) -> str:
    """可接受范围的中文描述，如“需要 1 到 100 之间的整数”。"""
    if minimum is not None and maximum is not None:
        return f"需要 {minimum} 到 {maximum} 之间的{noun}"
    if minimum is not None:
        return f"需要不小于 {minimum} 的{noun}"
    if maximum is not None:
        return f"需要不大于 {maximum} 的{noun}"
    return f"需要{noun}"


def _warn_invalid(name: str, raw: str, default: Any, reason: str) -> None:
    # settings 加载早于 structlog 配置，这里的告警走标准 logging；同时打印到 stderr 以免被吞掉
    message = f"invalid value for {name}={raw!r} ({reason}); falling back to default {default!r}"
    logger.warning(message)
    print(f"[infra.config] WARNING: {message}", file=sys.stderr)


def _parse(name: str, kind: str, default: T, help_text: str, convert: Callable[[str], T], accepted: str) -> T:
    """读取并转换一个变量；``accepted`` 是可接受取值的中文描述，生产模式的报错里用它。"""
    _register(name, kind, default, help_text)
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return convert(raw.strip())
    except (ValueError, OverflowError) as exc:
        if _validation.production:
            _reject(f"{name}={raw.strip()} 不合法：{accepted}")
        else:
            _warn_invalid(name, raw, default, str(exc))
        return default


def env_str(name: str, default: str, help_text: str, choices: tuple[str, ...] | None = None) -> str:
    """字符串变量；给出 choices 时只接受其中之一（忽略大小写）。"""

    def convert(raw: str) -> str:
        if choices is not None:
            value = raw.lower()
            if value not in choices:
                raise ValueError(f"expected one of {', '.join(choices)}")
            return value
        return raw

    kind = "|".join(choices) if choices else "string"
    return _parse(name, kind, default, help_text, convert, _one_of(choices) if choices else "需要字符串")


def env_int(name: str, default: int, help_text: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """整数变量，越界视为非法值。"""

    def convert(raw: str) -> int:
        value = int(raw)
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be <= {maximum}")
        return value

    return _parse(name, "int", default, help_text, convert, _range("整数", minimum, maximum))


def env_float(name: str, default: float, help_text: str, minimum: float | None = None) -> float:
    """浮点变量；nan、inf 视为非法值。"""

    def convert(raw: str) -> float:
        value = float(raw)
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}")
        return value

    return _parse(name, "float", default, help_text, convert, _range("数字", minimum, None))


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_bool(name: str, default: bool, help_text: str) -> bool:
    """布尔变量：true/false、1/0、yes/no、on/off。"""

    def convert(raw: str) -> bool:
        value = raw.lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ValueError("expected true/false")

    return _parse(name, "bool", default, help_text, convert, "需要 true/false（也可写 1/0、yes/no、on/off）")


def env_size(name: str, default: int, help_text: str) -> int:
    """字节数，可带单位：``52428800``、``50MB``、``512KiB``。"""
    units = {"": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2, "gb": 1000**3, "gib": 1024**3}

    def convert(raw: str) -> int:
        text = raw.lower().replace(" ", "")
        number = text.rstrip("kmgib")
        unit = text[len(number) :]
        if unit not in units or not number:
            raise ValueError("expected bytes, optionally with a unit such as 50MB")
        value = int(float(number) * units[unit])
        if value <= 0:
            raise ValueError("must be positive")
        return value

    return _parse(name, "size", default, help_text, convert, "需要正的字节数，可带单位（如 52428800、50MB、512KiB）")


def env_secret(name: str, help_text: str, *, production: bool) -> str | None:
    """密钥类变量：生产模式下缺失即失败（fail fast），开发模式返回 None 由调用方兜底。"""
    _register(name, "secret", None, help_text)
    value = os.environ.get(name, "").strip()
    if value:
        return value
    if production:
        raise ImproperlyConfigured(f"{name} must be set when RAG_ENV=production")
    return None


def database_from_url(url: str) -> dict[str, Any]:
    """把 ``postgresql://user:pass@host:port/db?sslmode=...`` 转成 Django DATABASES 项。

    支持 ``?host=/path`` 形式的 Unix socket（内嵌 PostgreSQL 就是这样给出地址的）。
    """
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql", "postgresql+psycopg"}:
        raise ImproperlyConfigured(f"RAG_DATABASE_URL must be a postgresql:// URL, got scheme {parts.scheme!r}")
    query = dict(parse_qsl(parts.query))
    host = query.pop("host", None) or unquote(parts.hostname or "")
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("RAG_DATABASE_URL must name a database")
    return {
        "ENGINE": "infra.postgres_backend",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        "OPTIONS": query,
    }


REDIS_SCHEMES = ("redis", "rediss", "unix")


def env_redis_url() -> str:
    """``RAG_REDIS_URL``：后台队列（django-q2 broker）以及其他需要跨进程共享状态的功能共用的 Redis。

    只在这里登记与校验，各处都读 ``settings.REDIS_URL``。空串表示不用 Redis（队列走数据库）。
    写错 scheme 直接启动失败而不是回退：回退会让一部分机器悄悄改走数据库队列，web 入队的任务没人取。
    """
    url = env_str("RAG_REDIS_URL", "", "Redis 地址（redis://host:6379/0、rediss://…、unix:///path）；设置后 "
                  "django-q2 任务队列（worker 可分布在多台机器上）与限流令牌桶都放在 Redis；不设置则都放在 PostgreSQL")
    if url and urlsplit(url).scheme not in REDIS_SCHEMES:
        raise ImproperlyConfigured(f"RAG_REDIS_URL must start with one of {', '.join(REDIS_SCHEMES)}://")
    return url


def ensure_dir(path: Path) -> Path:
    """创建目录（含父目录）并返回绝对路径。"""
    path = path.expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path
