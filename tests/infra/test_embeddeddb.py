"""内嵌 PostgreSQL 的生命周期：不需要数据库的命令不启动它；status/stop 如实报告；start 后 status 给出端口；
死掉的服务器只剩僵尸时照样能再启动。

每个用例一个全新的数据目录，在子进程里运行 manage.py（与运维在终端里敲的一样）。
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from infra import embedded_db

pytestmark = [pytest.mark.process, pytest.mark.slow]
ROOT = Path(settings.BASE_DIR)


def manage(data_dir: Path, *args: str, extra_env: dict[str, str] | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RAG_DATABASE_URL"} | {"RAG_DATA_DIR": str(data_dir)}
    env |= extra_env or {}
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


def test_shared_buffers_follow_the_setting_at_each_start(tmp_path: Path) -> None:
    """shared_buffers 写进数据目录、在启动时生效：新数据目录第一次启动就用设置的值（不是 PostgreSQL 默认的 128 MB），
    改了设置之后下一次启动换成新值；运维用 ALTER SYSTEM 设的值优先。"""
    data_dir = tmp_path / "data"

    def shared_buffers(megabytes: int) -> str:
        return manage(data_dir, "dbshell", "--", "-At", "-c", "show shared_buffers",
                      extra_env={"RAG_EMBEDDED_SHARED_BUFFERS_MB": str(megabytes)}).strip()

    try:
        assert shared_buffers(160) == "160MB"
        assert shared_buffers(192) == "160MB"  # 已在运行：不为换设置而重启
        manage(data_dir, "embeddeddb", "stop")
        assert shared_buffers(192) == "192MB"
        manage(data_dir, "dbshell", "--", "-c", "ALTER SYSTEM SET shared_buffers = '144MB'")
        manage(data_dir, "embeddeddb", "stop")
        assert shared_buffers(192) == "144MB"
        conf = (data_dir / "pgdata" / "postgresql.conf").read_text()
        assert conf.count(f"include_if_exists = '{embedded_db.SETTINGS_FILE}'") == 1
    finally:
        manage(data_dir, "embeddeddb", "stop")


@pytest.mark.parametrize(("memory_gib", "expected_mb"), [(0.25, 128), (2, 512), (8, 2048), (24, 4096), (256, 4096)])
def test_automatic_shared_buffers_are_a_quarter_of_memory_within_bounds(memory_gib: float, expected_mb: int) -> None:
    assert embedded_db.auto_shared_buffers_mb(int(memory_gib * 2**30)) == expected_mb


def test_memory_limit_is_at_most_the_machine_memory() -> None:
    assert 0 < embedded_db.memory_limit_bytes() <= psutil.virtual_memory().total


def test_external_database_is_reported_not_touched(tmp_path: Path) -> None:
    env = dict(os.environ) | {"RAG_DATA_DIR": str(tmp_path / "data"),
                              "RAG_DATABASE_URL": "postgresql://app@db.example:6543/rag"}
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "embeddeddb", "status"], cwd=ROOT, env=env,
                          check=True, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "已设置 RAG_DATABASE_URL（db.example:6543/rag），不使用内嵌 PostgreSQL"


@pytest.fixture
def zombie_pid() -> Iterator[int]:
    """一个已退出、没人回收的进程的 pid（不是本进程的子进程）：与没有 init 的容器里被杀掉的 postmaster 一样，
    pid 还“在”。sh 在后台起一个立即退出的 true，再把自己换成从不回收子进程的 sleep。"""
    holder = subprocess.Popen(["sh", "-c", "true & exec sleep 60"])
    deadline = time.monotonic() + 10
    while True:
        zombies = [child for child in psutil.Process(holder.pid).children()
                   if child.status() == psutil.STATUS_ZOMBIE]
        if zombies:
            break
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield zombies[0].pid
    holder.kill()  # 僵尸随之交给 init 回收
    holder.wait()


def test_a_dead_postmaster_left_as_a_zombie_does_not_block_the_next_start(tmp_path: Path, zombie_pid: int) -> None:
    """postmaster 被杀后只剩僵尸（锁文件里的 pid 还“在”）：以前每次连接等满 30 s 后报错，服务重启前再也连不上；
    现在 status 报已停止，下一次连接清掉锁文件、重新启动服务器。"""
    data_dir = tmp_path / "data"
    pid_file = data_dir / "pgdata" / "postmaster.pid"
    try:
        manage(data_dir, "embeddeddb", "start")
        lines = pid_file.read_text().splitlines()
        manage(data_dir, "embeddeddb", "stop")
        pid_file.write_text("\n".join([str(zombie_pid), *lines[1:]]) + "\n")
        assert manage(data_dir, "embeddeddb", "status").splitlines()[0] == "内嵌 PostgreSQL：已停止"
        started = time.monotonic()
        assert manage(data_dir, "dbshell", "--", "-At", "-c", "select 41 + 1").strip() == "42"
        assert time.monotonic() - started < embedded_db.ACCEPT_WAIT_SECONDS
    finally:
        manage(data_dir, "embeddeddb", "stop")


def test_the_lock_file_stays_while_a_postgres_process_still_works_in_the_data_directory(tmp_path: Path,
                                                                                         zombie_pid: int) -> None:
    """postmaster 死了，但还有后端在这个数据目录里工作（孤儿后端的工作目录就是数据目录）：锁文件是防止两个服务器
    同时写一个数据目录的闸，不删；它们都退出之后才删。"""
    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    fake = tmp_path / "postgres"  # 名字叫 postgres 的进程，工作目录在数据目录里
    fake.symlink_to(shutil.which("sleep") or "/bin/sleep")
    backend = subprocess.Popen([str(fake), "30"], cwd=pgdata)
    try:
        (pgdata / "postmaster.pid").write_text(
            f"{zombie_pid}\n{pgdata}\n1700000000\n5432\n{pgdata}\n\n  5432001         0\nready   \n")
        assert not embedded_db.clear_dead_postmaster(pgdata)
        assert (pgdata / "postmaster.pid").exists()
        backend.kill()
        backend.wait()
        assert embedded_db.clear_dead_postmaster(pgdata)
        assert not (pgdata / "postmaster.pid").exists()
        assert not embedded_db.clear_dead_postmaster(pgdata)  # 没有锁文件：什么也不做
    finally:
        backend.kill()


@pytest.mark.parametrize(("content", "running"), [
    ("", False),  # 刚创建、还没写
    ("-4242\n/x/pgdata\n1795799337\n5432\n\n\n  4041037    262149\n", False),  # initdb 的单用户后端：负 pid、7 行
    ("{pid}\n/x/pgdata\n1795799337\n", True),  # postmaster（这里借本进程的 pid）写到一半
])
def test_a_half_written_lock_file_is_read_without_error_and_kept(tmp_path: Path, content: str, running: bool) -> None:
    """另一个进程正在 initdb 或启动服务器时锁文件只写了一部分（CI 的第二个并行 worker 读到过 initdb 的 7 行文件，
    pgserver 的 PostmasterInfo 断言失败，整个测试会话建不了库）：读它不出错，活着的进程不当作死了，锁文件不删。"""
    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    (pgdata / "postmaster.pid").write_text(content.format(pid=os.getpid()))
    assert embedded_db.embedded_database_status(tmp_path).running is running
    assert not embedded_db.clear_dead_postmaster(pgdata)
    assert (pgdata / "postmaster.pid").exists()
