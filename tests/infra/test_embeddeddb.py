"""内嵌 PostgreSQL 的生命周期：不需要数据库的命令不启动它；status/stop 如实报告；start 后 status 给出端口。

每个用例一个全新的数据目录，在子进程里运行 manage.py（与运维在终端里敲的一样）。
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

pytestmark = [pytest.mark.process, pytest.mark.slow]
ROOT = Path(settings.BASE_DIR)


def manage(data_dir: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RAG_DATABASE_URL"} | {"RAG_DATA_DIR": str(data_dir)}
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True, timeout=120)
    return done.stdout


def test_commands_that_need_no_database_never_start_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    assert "ragconfig" in manage(data_dir, "help")
    assert "RAG_DATA_DIR=" in manage(data_dir, "ragconfig")
    status = manage(data_dir, "embeddeddb", "status")
    assert status.splitlines()[0] == "内嵌 PostgreSQL：已停止"
    assert f"数据目录：{data_dir / 'pgdata'}" in status
    assert manage(data_dir, "embeddeddb", "stop").strip() == (
        f"内嵌 PostgreSQL 未在运行，无需停止（数据目录 {data_dir / 'pgdata'}）")
    # 四条命令之后既没有初始化数据目录，也没有服务器进程
    assert not (data_dir / "pgdata").exists()


def test_start_status_stop_round_trip(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    try:
        started = manage(data_dir, "embeddeddb", "start")
        assert started.splitlines()[0].startswith("内嵌 PostgreSQL：运行中（pid ")
        status = manage(data_dir, "embeddeddb", "status")
        assert status == started
        assert "端口：5432（只监听 Unix socket" in status and f"数据目录：{data_dir / 'pgdata'}" in status
        # 已在运行时再 start 只是复用
        assert manage(data_dir, "embeddeddb", "start") == status
        # dbshell 不经过普通连接：同样先解析内嵌服务器的地址
        assert manage(data_dir, "dbshell", "--", "-At", "-c", "select 41 + 1").strip() == "42"
        assert manage(data_dir, "embeddeddb", "stop").strip() == f"已停止（数据目录 {data_dir / 'pgdata'}）"
        assert manage(data_dir, "embeddeddb", "status").splitlines()[0] == "内嵌 PostgreSQL：已停止"
        assert manage(data_dir, "embeddeddb", "stop").startswith("内嵌 PostgreSQL 未在运行，无需停止")
    finally:
        manage(data_dir, "embeddeddb", "stop")


def test_external_database_is_reported_not_touched(tmp_path: Path) -> None:
    env = dict(os.environ) | {"RAG_DATA_DIR": str(tmp_path / "data"),
                              "RAG_DATABASE_URL": "postgresql://app@db.example:6543/rag"}
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "embeddeddb", "status"], cwd=ROOT, env=env,
                          check=True, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "已设置 RAG_DATABASE_URL（db.example:6543/rag），不使用内嵌 PostgreSQL"
