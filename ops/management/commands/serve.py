"""manage.py serve：一条命令跑起整个服务（gunicorn web + django-q2 worker）。

启动前完成迁移（含 worker 心跳用的缓存表）与静态文件；两个子进程共享一个 Prometheus 多进程目录，
任一子进程意外退出则整体退出（交给外层的进程管理器重启），SIGINT/SIGTERM 时优雅停止。

每个子进程是一个独立的进程组（gunicorn 的 worker、django-q2 的哨兵/worker/快队列集群都在组里）：
停止时向整个组发 SIGTERM，限时（STOP_SECONDS）等组里所有进程退出，仍在的一律 SIGKILL——
不会留下继续处理文档的孤儿 worker。

启动期间每半秒问一次自己的 /ready，就绪后打印一行。这些请求带本次启动随机生成的 X-Request-ID，web 子进程
从环境变量 ``infra.logging.SELF_PROBE_ENV`` 得知这个值，不为它们写访问日志（否则启动终端里是二十几行 503）；
别人发来的 /ready 照常记录。
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from infra.embedded_db import ensure_embedded_database
from infra.logging import SELF_PROBE_ENV
from ops.models import ApiKey

BASE_DIR = Path(settings.BASE_DIR)
# 停止时等子进程（及其进程组）优雅退出的秒数，之后 SIGKILL。worker 收到 SIGTERM 后在下一个检查点交还手上的摄取
# （infra.workers）：检查点之间最长的是一片 embedding（CPU 上一批 32 段约 5 秒，机器忙时翻几倍）与入库的那个事务
# （几万个分块的大文档要几十秒）。等不到检查点就被 SIGKILL 的文档会被回收器记一次 worker 死亡，所以宽限期按后者留足；
# 没有文档在处理时停止只要一两秒。外层的进程管理器（容器的 stop 超时、systemd 的 TimeoutStopSec）应不短于它
STOP_SECONDS = 60


class Command(BaseCommand):
    help = "迁移数据库后启动 web 服务（gunicorn）与后台 worker（django-q2），直到收到停止信号。"
    # 本次启动轮询自己 /ready 用的 X-Request-ID（handle 里生成）
    probe_id = ""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=settings.SERVE_HOST, help="监听地址（默认 RAG_HOST）")
        parser.add_argument("--port", type=int, default=settings.SERVE_PORT, help="监听端口（默认 RAG_PORT）")
        parser.add_argument("--no-worker", action="store_true", help="只启动 web，不启动 django-q2 worker")

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write("准备数据库（迁移）与静态文件……")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)

        # 自己轮询 /ready 用的请求 ID：每次启动随机生成，别人碰不上，也就不会因此少记他们的访问日志
        self.probe_id = f"serve-ready-{secrets.token_hex(8)}"
        env = self._child_env()
        env[SELF_PROBE_ENV] = self.probe_id
        children = {"web": self._start_web(env, options["host"], options["port"])}
        if not options["no_worker"]:
            children["worker"] = subprocess.Popen(  # noqa: S603 - 参数全部由本程序构造
                [sys.executable, str(BASE_DIR / "manage.py"), "qcluster"], env=env, cwd=BASE_DIR,
                start_new_session=True,
            )
        base = self._banner(options["host"], options["port"])
        self._supervise(children, f"{base}/ready")

    def _child_env(self) -> dict[str, str]:
        return child_env(Path(settings.DATA_DIR) / "metrics")

    def _start_web(self, env: dict[str, str], host: str, port: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(  # noqa: S603 - 参数全部由本程序构造
            web_command(host, port), env=env, cwd=BASE_DIR, start_new_session=True,
        )

    def _banner(self, host: str, port: int) -> str:
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - 仅用于展示
        base = f"http://{shown}:{port}"
        lines = [
            "",
            f"ragservice 已启动：{base}",
            f"  API 文档（Swagger UI）：{base}/api/docs/",
            f"  就绪检查：{base}/ready    指标：{base}/metrics    管理后台：{base}/admin/",
        ]
        if settings.AUTH_ENABLED:
            manage = f"{self._python()} manage.py"
            lines.append(f"  API key：{manage} createapikey 我的应用   （已有 {ApiKey.objects.count()} 把）")
            lines.append(f"  管理员账号：{manage} createsuperuser")
        else:
            lines.append("  注意：RAG_AUTH_ENABLED=false，API 不校验 key（仅限本地开发）")
        lines.append("worker 正在加载 embedding 模型与 OCR 引擎；加载完成后 /ready 变为 200，这里会再打印一行。")
        lines.append("按 Ctrl+C 停止。")
        self.stdout.write("\n".join(lines))
        self.stdout.flush()
        return base

    @staticmethod
    def _python() -> str:
        """横幅里给出可直接复制的解释器路径（项目内的 .venv 显示为相对路径）。"""
        try:
            return str(Path(sys.executable).relative_to(BASE_DIR))
        except ValueError:
            return sys.executable

    def _supervise(self, children: dict[str, subprocess.Popen[bytes]], ready_url: str) -> None:
        stopping = False
        started = time.monotonic()
        announced = False

        def request_stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        exit_code = 0
        while not stopping:
            dead = {name: p.returncode for name, p in children.items() if p.poll() is not None}
            if dead:
                self.stderr.write(f"子进程意外退出：{dead}，停止服务")
                exit_code = 1
                break
            if not announced and _is_ready(ready_url, probe_id=self.probe_id):
                announced = True
                self.stdout.write(f"ragservice 已就绪（启动后 {time.monotonic() - started:.0f} 秒）："
                                  "模型已加载，可以上传文档与检索。")
                self.stdout.flush()
            time.sleep(0.5)
        stop_groups(list(children.values()), timeout=STOP_SECONDS)
        if exit_code:
            sys.exit(exit_code)


def child_env(metrics_dir: Path) -> dict[str, str]:
    """web 与 worker 子进程的环境（基准脚本起 gunicorn 时也用它）：当前环境变量，加上已解析出的数据库地址与
    清空后的多进程指标目录 ``metrics_dir``。"""
    env = dict(os.environ)
    # 子进程直接连已解析出的数据库地址，不必各自再检查内嵌服务器
    if not env.get("RAG_DATABASE_URL"):
        env["RAG_DATABASE_URL"] = ensure_embedded_database(Path(settings.DATA_DIR),
                                                           shared_buffers_mb=settings.EMBEDDED_SHARED_BUFFERS_MB)
    # 多进程指标目录必须在每次启动时清空，否则会把上次运行的计数累加进来
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True)
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    env.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")
    return env


def web_command(host: str, port: int, *, workers: int | None = None) -> list[str]:
    """启动 web 服务（gunicorn）的命令行；故障注入测试用同一条命令起 web。"""
    return [
        sys.executable, "-m", "gunicorn", "ragservice.wsgi:application",
        "--config", str(BASE_DIR / "ragservice" / "gunicorn_conf.py"),
        "--bind", f"{host}:{port}",
        "--workers", str(workers or settings.WEB_WORKERS),
        "--threads", str(settings.WEB_THREADS),
        "--worker-class", "gthread",
        "--timeout", "120",
        "--graceful-timeout", "20",
        # gunicorn 默认把控制 socket 放在 ~/.gunicorn 的固定路径，多个实例会互相抢占
        "--no-control-socket",
    ]


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)


def group_alive(pgid: int) -> bool:
    """进程组里还有活着的进程吗？僵尸不算：容器里 PID 1 不收尸时，它们会一直留在组里。

    列举进程与读 pgid 之间进程可能刚好退出：``os.getpgid`` 抛 ProcessLookupError（不是 psutil.Error），
    那个进程已经不在了，跳过即可。
    """
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def stop_groups(procs: list[subprocess.Popen[bytes]], *, timeout: float) -> None:
    """SIGTERM 每个进程组，限时等组里所有进程退出（组长已退出但孙进程还在也要等），超时则 SIGKILL 整组。"""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        while time.monotonic() < deadline and group_alive(proc.pid):
            time.sleep(0.2)
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        # SIGKILL 是异步送达的：确认组里的进程真的没了再返回（至多几秒）
        killed_by = time.monotonic() + 5
        while time.monotonic() < killed_by and group_alive(proc.pid):
            time.sleep(0.05)


def _is_ready(url: str, *, probe_id: str = "") -> bool:
    """向自己的 /ready 问一次；连不上（web 还在启动）或 503 都算未就绪。

    ``probe_id`` 作为 X-Request-ID 发出：web 子进程认得它，不把这次轮询写进访问日志（见 infra.logging）。
    """
    headers = {"X-Request-ID": probe_id} if probe_id else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - 本机地址，由本程序构造
    try:
        with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310 - 同上
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False
