"""测试用的本地假 JSON HTTP 服务：127.0.0.1 上随机端口，只处理 POST，记录每个请求，可注入延迟。

子类只需实现 ``respond``（以及需要时的 ``claim``）决定应答；embedding 与重排序的 HTTP 客户端测试共用。
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


class FakeJsonServer:
    """127.0.0.1 上的假 JSON 服务：解析 POST 正文，记录 {"path", "body", "authorization"}，按 ``delay`` 延迟后应答。"""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.delay = 0.0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    server.requests.append({"path": self.path, "body": body,
                                            "authorization": self.headers.get("Authorization")})
                    claimed = server.claim(self.path, body)
                if server.delay:
                    time.sleep(server.delay)
                self._reply(*server.respond(self.path, body, claimed))

            def _reply(self, status: int, payload: Any) -> None:
                raw = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # 超时测试里客户端已经放弃了这个连接

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def claim(self, path: str, body: Any) -> Any:
        """在记录请求的同一把锁内调用（早于 delay）；返回值原样传给 ``respond``。默认什么也不做。"""
        return None

    def respond(self, path: str, body: Any, claimed: Any) -> tuple[int, Any]:
        """决定应答：返回 (状态码, JSON 正文)。在 delay 之后、锁外调用。"""
        raise NotImplementedError

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Self:
        """``with`` 块内服务在跑，退出时关闭（夹具里 ``with Server() as server: yield server``）。"""
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.requests)
