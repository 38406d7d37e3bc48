"""在子进程里解析上传的文件：地址空间上限（RLIMIT_AS）+ 墙钟超时，OCR 回到父进程做。

为什么用子进程：解析库（pdfminer、mammoth、openpyxl、pandas、bs4）在畸形文件上的内存与时间
没有上界，而且卡在 C 代码里时同进程内既打断不了、也限不住内存。子进程撞到 RLIMIT_AS 只是它自己
分配失败（MemoryError）或被杀，worker 本身与它已加载的 embedding 模型不受影响；超时直接 SIGKILL。
实测数据与取舍见 docs/RELIABILITY.md「恶意与畸形文件」。

为什么 OCR 留在父进程：OCR 模型（rapidocr 的 onnx，几百 MB）由 worker 启动时预热，子进程每个文档
重新加载要几秒；OCR 的输入在子进程里已按像素上限检查过，缩放到 MAX_IMAGE_SIDE 后再识别，内存有界。
子进程把要识别的图片字节发给父进程，父进程用自己的引擎识别后把文字发回。

小的纯文本与 Markdown 不进子进程（:func:`parses_in_process`）：它们由本项目自己的代码解码（编码判定只看前 64 KB），
时间与内存随文件大小线性增长、有上界；起一个解析子进程（约 0.2 s，几乎全是 Python 启动与导入）比解析本身慢几十倍，
而知识库里这类文件最多。大文件仍进子进程：解码与整理时的内存是文件大小的数倍，不该压在 worker 上。

父子之间只传 JSON 与原始字节（不用 pickle）：子进程处理的是不可信的文件，即使解析库被攻破，
也不能借反序列化在 worker 里执行代码。
"""

from __future__ import annotations

# resource、PIL、logging 的配置在解析子进程的函数里导入：只属于子进程。
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import structlog
from django.conf import settings

from raglib.parsing import ParsedDocument, ParseError, Segment, parse_document
from raglib.parsing.detect import detect_format
from raglib.parsing.limits import ParseLimits
from raglib.parsing.ocr import OcrEngine
from raglib.parsing.pipeline import HEAD_BYTES

logger = structlog.get_logger(__name__)

_PROJECT_ROOT = Path(__file__).resolve().parent.parent
# 子进程里的数值库只用一个线程：每个线程都会预留虚拟内存，白白吃掉 RLIMIT_AS 的额度
_CHILD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# 子进程启动后多久还没有任何消息也照样检查它是否还活着（秒）
_POLL_SECONDS = 0.5
# 子进程异常退出时记进日志的 stderr 末尾字节数
_STDERR_TAIL_BYTES = 4000
# 子进程 CPU 时间上限比墙钟上限多出的秒数
_CPU_SLACK_SECONDS = 5
# 在本进程里解析的格式与大小上限（见模块说明）
IN_PROCESS_FORMATS = frozenset({"txt", "markdown"})
IN_PROCESS_MAX_BYTES = 1 << 20


class SandboxFailure(ParseError):
    """解析子进程超时、超内存或崩溃。"""


@dataclass(frozen=True)
class SandboxResult:
    """解析结果与子进程的资源用量（峰值 RSS 来自 wait4 的 rusage）。"""

    parsed: ParsedDocument
    max_rss_bytes: int
    seconds: float


class _Channel:
    """一对管道上的 JSON 消息 + 原始字节（长度前缀由 multiprocessing.connection 负责）。"""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.incoming = Connection(read_fd, writable=False)
        self.outgoing = Connection(write_fd, readable=False)

    def send(self, message: dict[str, Any]) -> None:
        self.outgoing.send_bytes(json.dumps(message, ensure_ascii=False, default=str).encode("utf-8"))

    def send_raw(self, data: bytes) -> None:
        self.outgoing.send_bytes(data)

    def recv(self) -> dict[str, Any]:
        value = json.loads(self.incoming.recv_bytes())
        if not isinstance(value, dict):
            raise EOFError("malformed message")
        return value

    def recv_raw(self) -> bytes:
        return self.incoming.recv_bytes()

    def close(self) -> None:
        self.incoming.close()
        self.outgoing.close()


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):.0f} MB"


class _Child:
    """父进程一侧：启动子进程、应答 OCR 请求、转发日志、收结果、计量资源。"""

    def __init__(self, *, memory_limit: int, timeout: float) -> None:
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        env = {**os.environ, **_CHILD_ENV}
        # 子进程的 stderr（崩溃时的堆栈、内存耗尽时的一串 MemoryError）先写进临时文件，异常退出时把末尾记进日志
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - 活得比子进程长，由 parse_isolated 关闭
        self.started = time.monotonic()
        # CPU 时间上限是墙钟上限之外的兜底：worker 被 SIGKILL 时没人再来杀子进程，它最多再烧这么久 CPU。
        # 子进程留在 worker 的进程组里，整组停止 worker 时它一起停止
        cpu_limit = math.ceil(max(timeout, 1.0)) + _CPU_SLACK_SECONDS
        self.process = subprocess.Popen(  # noqa: S603 - 参数全部由本程序构造
            [sys.executable, "-m", "documents.sandbox", str(child_read), str(child_write), str(memory_limit),
             str(cpu_limit)],
            cwd=_PROJECT_ROOT, env=env, pass_fds=(child_read, child_write), stdin=subprocess.DEVNULL,
            stderr=self.stderr,
        )
        os.close(child_read)
        os.close(child_write)
        self.channel = _Channel(parent_read, parent_write)
        self.max_rss_bytes = 0

    def converse(self, request: dict[str, Any], *, ocr: OcrEngine | None, timeout: float) -> dict[str, Any] | None:
        """发出请求并应答子进程，直到它给出结果；超时杀掉子进程，子进程死掉返回 None。"""
        deadline = self.started + timeout
        self.channel.send(request)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.process.kill()
                raise SandboxFailure(f"Parsing did not finish within the time limit ({timeout:.0f} s left of "
                                     "RAG_INGEST_TIMEOUT); the parser was stopped")
            try:
                if not self.channel.incoming.poll(min(remaining, _POLL_SECONDS)):
                    continue
                message = self.channel.recv()
            except (EOFError, OSError, ValueError):
                return None
            kind = message.get("type")
            if kind == "log":
                fields = message.get("fields") or {}
                logger.log(int(message.get("level", 20)), str(message.get("event")), sandbox=True, **fields)
            elif kind == "ocr":
                self._answer_ocr(ocr)
            else:
                return message

    def _answer_ocr(self, ocr: OcrEngine | None) -> None:
        image = self.channel.recv_raw()
        if ocr is None:
            self.channel.send({"error": "no OCR engine"})
            return
        try:
            text = ocr.recognize(image)
        except Exception as exc:  # 引擎的异常原样转成文字交回子进程，由 OcrSession 记为一次失败
            self.channel.send({"error": f"{type(exc).__name__}: {exc}"})
            return
        self.channel.send({"text": text})

    def finish(self) -> int:
        """等子进程退出，取 wait4 的 rusage 峰值 RSS（单位 KiB）作上界，返回退出码。"""
        self.channel.close()
        try:
            _, status, usage = os.wait4(self.process.pid, 0)
        except ChildProcessError:
            return self.process.returncode or 0
        self.process.returncode = os.waitstatus_to_exitcode(status)
        # 子进程是从 worker fork 出来再 exec 的，rusage 的峰值把 exec 之前共享的 worker 内存也算进去了，
        # 只是上界；子进程正常结束时改用它自己报告的 VmHWM（exec 之后的新地址空间的峰值）
        self.max_rss_bytes = usage.ru_maxrss * 1024
        return self.process.returncode

    def stderr_tail(self) -> str:
        with self.stderr:
            self.stderr.seek(max(self.stderr.seek(0, os.SEEK_END) - _STDERR_TAIL_BYTES, 0))
            return self.stderr.read().decode("utf-8", "replace")

    def abandon(self) -> None:
        if self.process.poll() is None:
            self.process.kill()


def parse_limits() -> ParseLimits:
    """settings 中的 RAG_INGEST_* 上限（子进程不读 settings，由父进程传入）。"""
    return ParseLimits(max_chars=settings.INGEST_MAX_CHARS, max_archive_member=settings.INGEST_MAX_ARCHIVE_MEMBER,
                       max_archive_total=settings.INGEST_MAX_ARCHIVE_TOTAL,
                       max_archive_ratio=settings.INGEST_MAX_ARCHIVE_RATIO,
                       max_image_pixels=settings.INGEST_MAX_IMAGE_PIXELS)


def _parsed_from(message: dict[str, Any]) -> ParsedDocument:
    segments = tuple(Segment(text=text, page=page, sheet=sheet, slide=slide)
                     for text, page, sheet, slide in message["segments"])
    return ParsedDocument(segments=segments, format=message["format"], ocr_engine=message["ocr_engine"],
                          ocr_images=int(message["ocr_images"]), ocr_skipped=bool(message["ocr_skipped"]),
                          notes=tuple(str(note) for note in message.get("notes") or ()))


def parses_in_process(head: bytes, filename: str, size: int) -> bool:
    """这个文件是否不进子进程、直接在本进程解析：不超过 ``IN_PROCESS_MAX_BYTES`` 的纯文本或 Markdown。
    ``head`` 是文件开头（至少 8 KiB，文件更短时为全部）；格式判定不了（不支持、名不副实）的进子进程报错。"""
    if size > IN_PROCESS_MAX_BYTES:
        return False
    try:
        return detect_format(head, filename) in IN_PROCESS_FORMATS
    except ParseError:
        return False


def parse_isolated(path: Path, *, filename: str, ocr: OcrEngine | None, limits: ParseLimits,
                   memory_limit: int, timeout: float) -> SandboxResult:
    """在子进程里 ``parse_document``（小的纯文本与 Markdown 在本进程，见 :func:`parses_in_process`）；
    解析错误原样抛 ParseError，超时 / 超内存 / 崩溃抛 SandboxFailure。"""
    try:
        with path.open("rb") as handle:
            head = handle.read(HEAD_BYTES)
        in_process = parses_in_process(head, filename, path.stat().st_size)
    except OSError:
        in_process = False  # 读不了的文件交给子进程，由它照常报告
    if in_process:
        started = time.monotonic()
        parsed = parse_document(path, filename=filename, ocr=ocr, limits=limits)
        return SandboxResult(parsed=parsed, max_rss_bytes=0, seconds=time.monotonic() - started)
    child = _Child(memory_limit=memory_limit, timeout=timeout)
    reply: dict[str, Any] | None = None
    try:
        reply = child.converse(
            {"path": str(path), "filename": filename, "ocr": ocr.name if ocr is not None else None,
             "limits": limits.as_dict()},
            ocr=ocr, timeout=timeout)
    finally:
        if reply is None:
            child.abandon()
        code = child.finish()
        if reply is not None and reply.get("peak_rss"):
            child.max_rss_bytes = int(reply["peak_rss"])
        seconds = time.monotonic() - child.started
        logger.info("parse_sandbox_finished", max_rss_mb=round(child.max_rss_bytes / 2**20, 1), exit_code=code,
                    duration_ms=round(seconds * 1000, 1), memory_limit_mb=round(memory_limit / 2**20))
        if reply is None or code != 0:
            logger.warning("parse_sandbox_stderr", exit_code=code, stderr=child.stderr_tail())
        else:
            child.stderr.close()
    if reply is None:
        # 解析库在 C 代码里分配失败时常常直接 abort / 段错误，而不是抛 MemoryError；同一个文件再试也一样
        raise SandboxFailure(
            f"The parser process stopped unexpectedly (exit code {code}); the file is malformed or needs more "
            f"than the memory limit of {_megabytes(memory_limit)} (RAG_INGEST_PARSE_MEMORY)")
    if reply.get("type") == "memory":
        raise SandboxFailure(
            f"The parser needed more than the memory limit of {_megabytes(memory_limit)} "
            "(RAG_INGEST_PARSE_MEMORY) and was stopped; the file is too large or malformed")
    if reply.get("type") == "error":
        raise ParseError(str(reply["message"]), permanent=bool(reply["permanent"]))
    return SandboxResult(parsed=_parsed_from(reply), max_rss_bytes=child.max_rss_bytes, seconds=seconds)


# ---------------------------------------------------------------- 子进程一侧


class _RemoteOcr:
    """子进程里的 OCR 引擎替身：把图片交给父进程识别。"""

    def __init__(self, name: str, channel: _Channel) -> None:
        self.name = name
        self.channel = channel

    def recognize(self, image: bytes) -> str:
        self.channel.send({"type": "ocr"})
        self.channel.send_raw(image)
        reply = self.channel.recv()
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return str(reply["text"])


def _forward_logs(channel: _Channel) -> None:
    """子进程的 structlog 事件发回父进程记录（带上父进程绑定的请求 ID 等上下文）。"""
    import logging

    def forward(_logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> Any:
        event = event_dict.pop("event", "")
        level = logging.getLevelName(method.upper())
        channel.send({"type": "log", "event": event, "level": level if isinstance(level, int) else 20,
                      "fields": event_dict})
        raise structlog.DropEvent

    structlog.configure(processors=[forward])


def peak_rss() -> int:
    """本进程 exec 之后的峰值 RSS（字节，/proc/self/status 的 VmHWM）；读不到时为 0。"""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _child_main(read_fd: int, write_fd: int, memory_limit: int, cpu_limit: int) -> None:
    import resource

    from PIL import Image

    resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit))
    # 像素上限由 ParseLimits 在解码前按文件头检查，并给出准确尺寸；Pillow 自己的检查会抢先抛出而拿不到尺寸
    Image.MAX_IMAGE_PIXELS = None
    channel = _Channel(read_fd, write_fd)
    _forward_logs(channel)
    request = channel.recv()
    engine = _RemoteOcr(request["ocr"], channel) if request["ocr"] else None
    channel.send({**_child_parse(request, engine), "peak_rss": peak_rss()})


def _child_parse(request: dict[str, Any], engine: _RemoteOcr | None) -> dict[str, Any]:
    try:
        parsed = parse_document(Path(request["path"]), filename=request["filename"], ocr=engine,
                                limits=ParseLimits.from_dict(request["limits"]))
    except ParseError as exc:
        return {"type": "error", "message": exc.message, "permanent": exc.permanent}
    except MemoryError:
        return {"type": "memory"}
    except Exception as exc:  # 解析库的其他异常（RecursionError、KeyError……）：与原先同进程时一样按永久失败报告
        return {"type": "error", "message": f"Unexpected error while parsing ({type(exc).__name__}): {exc}",
                "permanent": True}
    return {
        "type": "result", "format": parsed.format, "ocr_engine": parsed.ocr_engine, "ocr_images": parsed.ocr_images,
        "ocr_skipped": parsed.ocr_skipped, "notes": list(parsed.notes),
        "segments": [[s.text, s.page, s.sheet, s.slide] for s in parsed.segments],
    }


if __name__ == "__main__":
    _child_main(*(int(arg) for arg in sys.argv[1:5]))
