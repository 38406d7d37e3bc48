"""infra.config：RAG_* 环境变量的解析、非法值告警回退（开发）或拒绝启动（生产）、密钥 fail fast、数据库 URL 与文档。"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from infra import config
from infra.config import (
    database_from_url,
    env_bool,
    env_float,
    env_int,
    env_mode,
    env_secret,
    env_size,
    env_str,
    raise_invalid,
)


@pytest.fixture(autouse=True)
def _isolated_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """测试里登记的 RAG_TEST_* 变量写进副本，不污染真实的 VARIABLES（ragconfig 命令持有原对象）；
    运行模式每个测试从开发模式开始，测试里切到生产模式也不会带到别的测试。"""
    monkeypatch.setattr(config, "VARIABLES", dict(config.VARIABLES))
    monkeypatch.setattr(config, "_validation", config._Validation())


def _assert_warned(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, name: str) -> None:
    """非法值既打印到 stderr，也经 logging 记一条 WARNING。"""
    err = capsys.readouterr().err
    assert f"invalid value for {name}=" in err, err
    assert "falling back to default" in err
    records = [r for r in caplog.records if r.name == "infra.config" and r.levelno == logging.WARNING]
    assert any(f"invalid value for {name}=" in r.getMessage() for r in records), caplog.records


def _assert_not_warned(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    assert "invalid value" not in capsys.readouterr().err
    assert not [r for r in caplog.records if r.name == "infra.config"]


# ---------------------------------------------------------------- 合法取值


def test_unset_and_blank_return_default(monkeypatch, capsys, caplog):
    monkeypatch.delenv("RAG_TEST_UNSET_INT", raising=False)
    assert env_int("RAG_TEST_UNSET_INT", 7, "help") == 7
    monkeypatch.setenv("RAG_TEST_BLANK_STR", "   ")
    assert env_str("RAG_TEST_BLANK_STR", "fallback", "help") == "fallback"
    _assert_not_warned(capsys, caplog)


def test_env_int_parses_and_strips(monkeypatch, capsys, caplog):
    monkeypatch.setenv("RAG_TEST_INT_OK", " 42 ")
    assert env_int("RAG_TEST_INT_OK", 1, "help", minimum=1, maximum=100) == 42
    monkeypatch.setenv("RAG_TEST_INT_BOUNDS", "100")
    assert env_int("RAG_TEST_INT_BOUNDS", 1, "help", minimum=1, maximum=100) == 100  # 边界值合法
    monkeypatch.setenv("RAG_TEST_INT_NEG", "-3")
    assert env_int("RAG_TEST_INT_NEG", 0, "help") == -3
    _assert_not_warned(capsys, caplog)


@pytest.mark.parametrize(("raw", "expected"), [
    ("1", True), ("true", True), ("TRUE", True), ("yes", True), ("On", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
def test_env_bool_values(monkeypatch, capsys, caplog, raw, expected):
    monkeypatch.setenv("RAG_TEST_BOOL_OK", raw)
    assert env_bool("RAG_TEST_BOOL_OK", not expected, "help") is expected
    _assert_not_warned(capsys, caplog)


def test_env_float_parses(monkeypatch):
    monkeypatch.setenv("RAG_TEST_FLOAT_OK", "0.25")
    assert env_float("RAG_TEST_FLOAT_OK", 1.0, "help", minimum=0.0) == 0.25
    monkeypatch.setenv("RAG_TEST_FLOAT_INT", "3")
    assert env_float("RAG_TEST_FLOAT_INT", 1.0, "help") == 3.0


def test_env_str_plain_and_choices(monkeypatch, capsys, caplog):
    monkeypatch.setenv("RAG_TEST_STR_PLAIN", "  Hello 世界 ")
    assert env_str("RAG_TEST_STR_PLAIN", "x", "help") == "Hello 世界"
    monkeypatch.setenv("RAG_TEST_STR_CHOICE", "PRODUCTION")
    # choices 忽略大小写，返回规范的小写值
    assert env_str("RAG_TEST_STR_CHOICE", "development", "help",
                   choices=("development", "production")) == "production"
    _assert_not_warned(capsys, caplog)


@pytest.mark.parametrize(("raw", "expected"), [
    ("52428800", 52_428_800),
    ("50MB", 50_000_000),
    ("50mb", 50_000_000),
    ("50 MB", 50_000_000),
    ("512KiB", 524_288),
    ("1kb", 1000),
    ("2MiB", 2 * 1024**2),
    ("1.5GB", 1_500_000_000),
    ("1GiB", 1024**3),
    ("100b", 100),
])
def test_env_size_units(monkeypatch, capsys, caplog, raw, expected):
    monkeypatch.setenv("RAG_TEST_SIZE_OK", raw)
    assert env_size("RAG_TEST_SIZE_OK", 1, "help") == expected
    _assert_not_warned(capsys, caplog)


# ---------------------------------------------------------------- 非法取值：告警并回退默认值


@pytest.mark.parametrize(("raw", "kwargs"), [
    ("abc", {}),                              # 不是数字
    ("4.5", {}),                              # 不是整数
    ("0", {"minimum": 1}),                    # 低于下限
    ("1001", {"minimum": 1, "maximum": 1000}),  # 高于上限
])
def test_env_int_invalid_falls_back_with_warning(monkeypatch, capsys, caplog, raw, kwargs):
    monkeypatch.setenv("RAG_TEST_INT_BAD", raw)
    assert env_int("RAG_TEST_INT_BAD", 40, "help", **kwargs) == 40
    _assert_warned(capsys, caplog, "RAG_TEST_INT_BAD")


def test_env_int_warning_names_the_reason(monkeypatch, capsys):
    monkeypatch.setenv("RAG_TEST_INT_REASON", "0")
    assert env_int("RAG_TEST_INT_REASON", 5, "help", minimum=1) == 5
    err = capsys.readouterr().err
    assert "RAG_TEST_INT_REASON='0'" in err
    assert "must be >= 1" in err
    assert "default 5" in err


@pytest.mark.parametrize("raw", ["maybe", "2", "tru"])
def test_env_bool_invalid_falls_back_with_warning(monkeypatch, capsys, caplog, raw):
    monkeypatch.setenv("RAG_TEST_BOOL_BAD", raw)
    assert env_bool("RAG_TEST_BOOL_BAD", True, "help") is True
    _assert_warned(capsys, caplog, "RAG_TEST_BOOL_BAD")


@pytest.mark.parametrize(("raw", "kwargs"), [("fast", {}), ("-0.5", {"minimum": 0.0})])
def test_env_float_invalid_falls_back_with_warning(monkeypatch, capsys, caplog, raw, kwargs):
    monkeypatch.setenv("RAG_TEST_FLOAT_BAD", raw)
    assert env_float("RAG_TEST_FLOAT_BAD", 0.5, "help", **kwargs) == 0.5
    _assert_warned(capsys, caplog, "RAG_TEST_FLOAT_BAD")


def test_env_str_bad_choice_falls_back_with_warning(monkeypatch, capsys, caplog):
    monkeypatch.setenv("RAG_TEST_STR_BAD", "staging")
    assert env_str("RAG_TEST_STR_BAD", "development", "help", choices=("development", "production")) == "development"
    _assert_warned(capsys, caplog, "RAG_TEST_STR_BAD")


@pytest.mark.parametrize("raw", ["abc", "MB", "50XB", "0", "-5MB", "12..5kb"])
def test_env_size_invalid_falls_back_with_warning(monkeypatch, capsys, caplog, raw):
    monkeypatch.setenv("RAG_TEST_SIZE_BAD", raw)
    assert env_size("RAG_TEST_SIZE_BAD", 1234, "help") == 1234
    _assert_warned(capsys, caplog, "RAG_TEST_SIZE_BAD")


@pytest.mark.parametrize("raw", ["inf", "1e400MB"])
def test_env_size_infinite_falls_back_with_warning(monkeypatch, capsys, caplog, raw):
    monkeypatch.setenv("RAG_TEST_SIZE_INF", raw)
    assert env_size("RAG_TEST_SIZE_INF", 1234, "help") == 1234
    _assert_warned(capsys, caplog, "RAG_TEST_SIZE_INF")


def test_env_float_rejects_non_finite_values(monkeypatch, capsys, caplog):
    for raw in ("nan", "inf", "-inf"):
        monkeypatch.setenv("RAG_TEST_FLOAT_NAN", raw)
        assert env_float("RAG_TEST_FLOAT_NAN", 0.5, "help") == 0.5
        _assert_warned(capsys, caplog, "RAG_TEST_FLOAT_NAN")


# ---------------------------------------------------------------- 生产模式：非法取值拒绝启动


def _enter_mode(monkeypatch: pytest.MonkeyPatch, mode: str) -> str:
    """像 settings.py 开头那样先解析 RAG_ENV。"""
    monkeypatch.setenv("RAG_ENV", mode)
    return env_mode("help")


@pytest.mark.parametrize(("read", "raw", "expected"), [
    (lambda n: env_int(n, 5, "h", minimum=1, maximum=100), "abc", "=abc 不合法：需要 1 到 100 之间的整数"),
    (lambda n: env_int(n, 5, "h", minimum=1, maximum=100), "101", "=101 不合法：需要 1 到 100 之间的整数"),
    (lambda n: env_int(n, 5, "h", minimum=1), "0", "=0 不合法：需要不小于 1 的整数"),
    (lambda n: env_int(n, 5, "h"), "4.5", "=4.5 不合法：需要整数"),
    (lambda n: env_float(n, 0.5, "h", minimum=0.001), "-1", "=-1 不合法：需要不小于 0.001 的数字"),
    (lambda n: env_float(n, 0.5, "h"), "fast", "=fast 不合法：需要数字"),
    (lambda n: env_str(n, "auto", "h", choices=("auto", "none")), "staging", "=staging 不合法：需要 auto、none 之一"),
    (lambda n: env_bool(n, True, "h"), "maybe", "=maybe 不合法：需要 true/false"),
    (lambda n: env_size(n, 1, "h"), "50XB", "=50XB 不合法：需要正的字节数"),
])
def test_production_invalid_value_fails_naming_variable_and_range(monkeypatch, capsys, caplog, read, raw, expected):
    assert _enter_mode(monkeypatch, "production") == "production"
    monkeypatch.setenv("RAG_TEST_PROD_BAD", f" {raw} ")
    read("RAG_TEST_PROD_BAD")  # settings 加载期间先收集，不立即失败
    with pytest.raises(ImproperlyConfigured) as excinfo:
        raise_invalid()
    assert f"RAG_TEST_PROD_BAD{expected}" in str(excinfo.value)
    _assert_not_warned(capsys, caplog)  # 生产模式不告警回退


def test_production_lists_every_invalid_value_at_once(monkeypatch):
    _enter_mode(monkeypatch, "production")
    monkeypatch.setenv("RAG_TEST_MANY_INT", "abc")
    monkeypatch.setenv("RAG_TEST_MANY_OK", "7")
    monkeypatch.setenv("RAG_TEST_MANY_FLOAT", "x")
    monkeypatch.setenv("RAG_TEST_MANY_CHOICE", "loud")
    env_int("RAG_TEST_MANY_INT", 20, "h", minimum=1, maximum=100)
    assert env_int("RAG_TEST_MANY_OK", 1, "h", minimum=1) == 7  # 合法值照常解析
    env_float("RAG_TEST_MANY_FLOAT", 1.0, "h", minimum=0.0)
    env_str("RAG_TEST_MANY_CHOICE", "info", "h", choices=("debug", "info"))
    with pytest.raises(ImproperlyConfigured) as excinfo:
        raise_invalid()
    message = str(excinfo.value)
    assert "RAG_TEST_MANY_INT=abc 不合法：需要 1 到 100 之间的整数" in message
    assert "RAG_TEST_MANY_FLOAT=x 不合法：需要不小于 0.0 的数字" in message
    assert "RAG_TEST_MANY_CHOICE=loud 不合法：需要 debug、info 之一" in message
    assert "RAG_TEST_MANY_OK" not in message
    raise_invalid()  # 报过一次就清空


def test_production_without_invalid_values_starts(monkeypatch):
    _enter_mode(monkeypatch, "PRODUCTION")  # 忽略大小写
    monkeypatch.setenv("RAG_TEST_PROD_OK", "3")
    assert env_int("RAG_TEST_PROD_OK", 1, "h", minimum=1) == 3
    raise_invalid()


def test_production_invalid_value_after_settings_loaded_fails_immediately(monkeypatch):
    """settings 加载完（raise_invalid 之后）再读到非法值，生产模式下即时失败。"""
    _enter_mode(monkeypatch, "production")
    raise_invalid()
    monkeypatch.setenv("RAG_TEST_LATE_BAD", "-1")
    with pytest.raises(ImproperlyConfigured, match="RAG_TEST_LATE_BAD=-1 不合法：需要不小于 0 的整数"):
        env_int("RAG_TEST_LATE_BAD", 1, "h", minimum=0)


def test_development_mode_still_warns_and_defaults(monkeypatch, capsys, caplog):
    assert _enter_mode(monkeypatch, "development") == "development"
    monkeypatch.setenv("RAG_TEST_DEV_BAD", "abc")
    assert env_int("RAG_TEST_DEV_BAD", 40, "h", minimum=1) == 40
    _assert_warned(capsys, caplog, "RAG_TEST_DEV_BAD")
    raise_invalid()  # 开发模式没有收集，不会失败


def test_unset_mode_is_development(monkeypatch):
    monkeypatch.delenv("RAG_ENV", raising=False)
    assert env_mode("help") == "development"
    assert config.VARIABLES["RAG_ENV"].kind == "development|production"


@pytest.mark.parametrize("raw", ["prod", "staging"])
def test_invalid_mode_always_fails(monkeypatch, raw):
    """RAG_ENV 自己写错不回退到 development：那会悄悄关掉生产模式的全部保护。"""
    monkeypatch.setenv("RAG_ENV", raw)
    with pytest.raises(ImproperlyConfigured, match=f"RAG_ENV={raw} 不合法：需要 development、production 之一"):
        env_mode("help")


def _load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """在子进程里用给定的 RAG_* 变量加载 settings（本进程的 settings 早已加载）。"""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    return subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=settings.BASE_DIR,
                          env={**base, "DJANGO_SETTINGS_MODULE": "ragservice.settings",
                               "RAG_DATA_DIR": str(tmp_path / "data"), **env},
                          capture_output=True, text=True, timeout=120)


def test_settings_fail_fast_in_production_and_warn_in_development(tmp_path):
    """settings.py 先解析 RAG_ENV、末尾调用 raise_invalid：生产模式一次报出全部非法值，开发模式照常启动。"""
    bad = {"RAG_SECRET_KEY": "x", "RAG_HNSW_EF_SEARCH": "abc", "RAG_RERANK_TIMEOUT": "soon",
           "RAG_LOG_FORMAT": "xml", "RAG_PORT": "70000"}
    result = _load_settings(tmp_path, RAG_ENV="production", **bad)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    for expected in ("RAG_HNSW_EF_SEARCH=abc 不合法：需要 1 到 1000 之间的整数",
                     "RAG_RERANK_TIMEOUT=soon 不合法：需要不小于 0.1 的数字",
                     "RAG_LOG_FORMAT=xml 不合法：需要 json、console 之一",
                     "RAG_PORT=70000 不合法：需要 1 到 65535 之间的整数"):
        assert expected in result.stderr, result.stderr
    result = _load_settings(tmp_path, RAG_ENV="development", **bad)
    assert result.returncode == 0, result.stderr
    assert "invalid value for RAG_HNSW_EF_SEARCH='abc'" in result.stderr


# ---------------------------------------------------------------- 登记表


def test_variables_are_registered_with_kind_and_default(monkeypatch):
    monkeypatch.setenv("RAG_TEST_REG", "9")
    env_int("RAG_TEST_REG", 3, "说明文字")
    var = config.VARIABLES["RAG_TEST_REG"]
    assert (var.name, var.kind, var.default, var.help) == ("RAG_TEST_REG", "int", 3, "说明文字")
    env_str("RAG_TEST_REG_CHOICE", "a", "h", choices=("a", "b"))
    assert config.VARIABLES["RAG_TEST_REG_CHOICE"].kind == "a|b"


def test_same_definition_may_be_read_twice_but_conflicting_one_raises():
    assert env_int("RAG_TEST_TWICE", 3, "help") == 3
    assert env_int("RAG_TEST_TWICE", 3, "help") == 3  # 同一定义重复读取是允许的
    with pytest.raises(ImproperlyConfigured, match="registered twice"):
        env_int("RAG_TEST_TWICE", 4, "help")
    with pytest.raises(ImproperlyConfigured, match="registered twice"):
        env_str("RAG_TEST_TWICE", "3", "help")


def test_settings_registered_core_variables():
    for name in ("RAG_ENV", "RAG_SECRET_KEY", "RAG_DATABASE_URL", "RAG_HNSW_EF_SEARCH", "RAG_METRICS_ENABLED",
                 "RAG_LOG_LEVEL", "RAG_AUTH_ENABLED"):
        assert name in config.VARIABLES, name
    assert config.VARIABLES["RAG_SECRET_KEY"].kind == "secret"
    assert config.VARIABLES["RAG_HNSW_EF_SEARCH"].default == 40


# ---------------------------------------------------------------- 密钥


def test_env_secret_production_requires_value(monkeypatch):
    monkeypatch.delenv("RAG_TEST_SECRET_PROD", raising=False)
    with pytest.raises(ImproperlyConfigured, match="RAG_TEST_SECRET_PROD must be set"):
        env_secret("RAG_TEST_SECRET_PROD", "help", production=True)
    monkeypatch.setenv("RAG_TEST_SECRET_PROD", "   ")  # 只有空白等同未设置
    with pytest.raises(ImproperlyConfigured):
        env_secret("RAG_TEST_SECRET_PROD", "help", production=True)
    monkeypatch.setenv("RAG_TEST_SECRET_PROD", " s3cret ")
    assert env_secret("RAG_TEST_SECRET_PROD", "help", production=True) == "s3cret"


def test_env_secret_development_returns_none_when_unset(monkeypatch):
    monkeypatch.delenv("RAG_TEST_SECRET_DEV", raising=False)
    assert env_secret("RAG_TEST_SECRET_DEV", "help", production=False) is None
    monkeypatch.setenv("RAG_TEST_SECRET_DEV", "dev-key")
    assert env_secret("RAG_TEST_SECRET_DEV", "help", production=False) == "dev-key"
    assert config.VARIABLES["RAG_TEST_SECRET_DEV"].kind == "secret"


# ---------------------------------------------------------------- 数据库 URL


def test_database_from_url_tcp():
    db = database_from_url(
        "postgresql://alice:p%40ss%3Aw%2Frd@db.example.com:6543/rag%2Ddb?sslmode=require&connect_timeout=5"
    )
    assert db == {
        "ENGINE": "infra.postgres_backend",
        "NAME": "rag-db",
        "USER": "alice",
        "PASSWORD": "p@ss:w/rd",
        "HOST": "db.example.com",
        "PORT": "6543",
        "OPTIONS": {"sslmode": "require", "connect_timeout": "5"},
    }


@pytest.mark.parametrize("scheme", ["postgres", "postgresql", "postgresql+psycopg"])
def test_database_from_url_accepts_postgres_schemes_without_port(scheme):
    db = database_from_url(f"{scheme}://bob@localhost/ragservice")
    got = (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"])
    assert got == ("bob", "", "localhost", "", "ragservice")
    assert db["OPTIONS"] == {}


def test_database_from_url_unix_socket():
    db = database_from_url("postgresql://postgres:@/ragservice?host=/tmp/x")
    assert db["HOST"] == "/tmp/x"
    assert db["PORT"] == ""
    assert db["USER"] == "postgres"
    assert db["PASSWORD"] == ""
    assert db["NAME"] == "ragservice"
    assert db["OPTIONS"] == {}  # host 不会残留在 OPTIONS 里


def test_database_from_url_unix_socket_percent_encoded_and_extra_options():
    db = database_from_url("postgresql://postgres@/ragservice?host=%2Fvar%2Frun%2Fpg%20sock&sslmode=disable")
    assert db["HOST"] == "/var/run/pg sock"
    assert db["OPTIONS"] == {"sslmode": "disable"}


@pytest.mark.parametrize("url", [
    "mysql://root@localhost/ragservice",
    "sqlite:///tmp/db.sqlite3",
    "http://localhost/ragservice",
    "localhost:5432/ragservice",
])
def test_database_from_url_rejects_non_postgres_scheme(url):
    with pytest.raises(ImproperlyConfigured, match="postgresql://"):
        database_from_url(url)


@pytest.mark.parametrize("url", [
    "postgresql://alice@db.example.com:5432",
    "postgresql://alice@db.example.com:5432/",
    "postgresql://postgres:@/?host=/tmp/x",
])
def test_database_from_url_requires_database_name(url):
    with pytest.raises(ImproperlyConfigured, match="must name a database"):
        database_from_url(url)


def test_settings_database_has_ef_search_option():
    options = settings.DATABASES["default"]["OPTIONS"]
    assert f"-c hnsw.ef_search={settings.HNSW_EF_SEARCH}" in options["options"]


# ---------------------------------------------------------------- 文档（manage.py ragconfig）


def _markdown() -> str:
    out = StringIO()
    call_command("ragconfig", "--markdown", stdout=out)
    return out.getvalue()


def test_ragconfig_markdown_lists_every_variable():
    text = _markdown()
    assert text.startswith("| 变量 | 类型 | 默认值 | 说明 |")
    rag_names = [name for name in config.VARIABLES if name.startswith("RAG_")]
    assert len(rag_names) >= 20
    for name in rag_names:
        assert f"| `{name}` |" in text, name
    # 每个变量一行，没有重复
    rows = re.findall(r"^\| `(RAG_[A-Z0-9_]+)` \|", text, flags=re.MULTILINE)
    assert len(rows) == len(set(rows))
    assert "RAG_TEST_" not in text


def test_ragconfig_plain_output_hides_secret_values(monkeypatch):
    monkeypatch.setenv("RAG_SECRET_KEY", "do-not-print-me")
    out = StringIO()
    call_command("ragconfig", stdout=out)
    text = out.getvalue()
    assert "RAG_SECRET_KEY=<secret>" in text
    assert "do-not-print-me" not in text


def test_readme_documents_every_variable():
    readme = Path(settings.BASE_DIR) / "README.md"
    if not readme.exists():
        pytest.skip("README.md 尚不存在")
    text = readme.read_text(encoding="utf-8")
    missing = [name for name in config.VARIABLES
               if name.startswith("RAG_") and not name.startswith("RAG_TEST_") and name not in text]
    assert not missing, f"README.md 缺少这些变量：{missing}"


def test_landing_page_shows_the_readme_commands(client):
    """首页给出的每一条命令都与 README 里的写法逐字相同（改了一处就会发现另一处没改）。"""
    import html as html_module
    import re

    readme = (Path(settings.BASE_DIR) / "README.md").read_text(encoding="utf-8")
    page = client.get("/").content.decode()
    block = re.search(r'<pre id="commands">(.*?)</pre>', page, re.S)
    assert block
    commands = [html_module.unescape(line) for line in block.group(1).splitlines()]
    assert len(commands) == 5
    for command in commands:
        assert command in readme, command


@pytest.mark.parametrize(("configured", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_openmp_threads_sleep_when_idle_unless_configured(configured, expected):
    """settings 在任何模型库加载前给 OpenMP 设 PASSIVE（忙等的线程在满载的机器上把查询向量化拖慢一个量级）；
    显式设置的值不覆盖。在子进程里看：本进程的 settings 早已加载。"""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["DJANGO_SETTINGS_MODULE"] = "ragservice.settings"
    if configured:
        env["OMP_WAIT_POLICY"] = configured
    code = "import os, django; django.setup(); print(os.environ['OMP_WAIT_POLICY'])"
    result = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env, capture_output=True,
                            text=True, timeout=120, check=True)
    assert result.stdout.strip().splitlines()[-1] == expected


# ---------------------------------------------------------------- 连接健康检查


@pytest.mark.django_db(transaction=True)
def test_health_check_is_skipped_only_right_after_a_clean_round(monkeypatch: pytest.MonkeyPatch,
                                                                 settings: Any) -> None:
    """刚无错用完的连接下一轮不发 SELECT 1；空闲超过窗口、上一轮出过错、窗口为 0 时照常检查。"""
    from django.db import close_old_connections, connection

    settings.DB_HEALTH_CHECK_WINDOW_MS = 500
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)  # 测试设置里是 0：每轮都换新连接
    connection.close()
    checks: list[int] = []
    healthy = [True]
    real_is_usable = connection.is_usable
    monkeypatch.setattr(connection, "is_usable", lambda: checks.append(1) or (healthy[0] and real_is_usable()))

    def request_round(*, fail: bool = False) -> int:
        """一轮请求：开始与结束各一次 close_old_connections（与 Django 的请求信号相同），中间用连接。

        返回这一轮里健康检查的次数。"""
        before = len(checks)
        close_old_connections()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        if fail:
            connection.errors_occurred = True  # 本轮遇到过非数据类的数据库错误
        close_old_connections()
        return len(checks) - before

    request_round()
    assert request_round() == 0  # 上一轮刚刚无错用完
    close_old_connections()  # 请求开始时的调用不算“用过”
    connection._proven_at -= 1.0  # 空闲了 1 秒
    assert request_round() == 1
    assert request_round(fail=True) == 1  # 出错的那一轮结束时 Django 自己检查一次，通过即是刚刚的证明
    assert request_round() == 0
    healthy[0] = False
    assert request_round(fail=True) == 1  # 检查不通过：连接被关掉，下一轮新建
    assert connection.connection is None and connection._proven_at is None
    healthy[0] = True
    assert request_round() == 0  # 新建的连接不用检查（Django 的原样行为）
    assert request_round() == 0
    settings.DB_HEALTH_CHECK_WINDOW_MS = 0
    assert request_round() == 1


@pytest.mark.django_db(transaction=True)
def test_a_round_that_starts_with_a_prepared_statement_checks_the_connection_first(
        monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """鉴权的预备语句（``fetchall_prepared``）是每个请求的第一条：它与 Django 的游标一样先做健康检查。连接在空闲时
    断了（数据库重启）的话，检查把它关掉、换一条新的，请求照常成功，而不是 503 一次。"""
    from django.db import close_old_connections, connection, connections

    from infra.routers import fetchall_prepared

    settings.DB_HEALTH_CHECK_WINDOW_MS = 500
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    connection.close()
    checks: list[int] = []
    real_is_usable = connection.is_usable
    monkeypatch.setattr(connection, "is_usable", lambda: checks.append(1) or real_is_usable())
    close_old_connections()
    [(pid,)] = fetchall_prepared(connection, "SELECT pg_backend_pid()", [])
    close_old_connections()
    dead = connection.connection
    other = connections.create_connection("default")  # 从另一条连接掐断它，像数据库重启时那样
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    close_old_connections()
    connection._proven_at -= 1.0  # 空闲了 1 秒：这一轮第一次用连接时要检查
    before = len(checks)
    assert fetchall_prepared(connection, "SELECT %s::int", [2]) == [(2,)]
    assert len(checks) == before + 1 and connection.connection is not dead
    close_old_connections()
