"""恶意与畸形文件的实测：解析子进程的耗时与峰值 RSS，以及病态文本分块的耗时与内存增量。

用法（项目根目录）：
    .venv/bin/python bench/hostile_files.py              # 全部解析用例 + 分块用例
    .venv/bin/python bench/hostile_files.py --skip-chunking

解析用例按 RAG_INGEST_* 的当前取值（默认值见 README）经 ``documents.sandbox.parse_isolated`` 运行，与摄取时完全相同
（OCR 关闭：这些文件都在 OCR 之前就有结论）。峰值 RSS 是子进程自己报告的 VmHWM。
分块用例各在一个新的子进程里运行 ``chunk_text``，报告加载 tokenizer 之后的 RSS 增量。
结果写进 docs/RELIABILITY.md「恶意与畸形文件」。
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")
os.environ.setdefault("RAG_LOG_LEVEL", "warning")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from bench.helpers import hostile_samples  # noqa: E402
from documents import sandbox  # noqa: E402
from documents.sandbox import parse_isolated, parse_limits  # noqa: E402
from raglib.parsing import ParseError  # noqa: E402

MB = 1024 * 1024


def _bytes(name: str, data: bytes) -> Callable[[Path], Path]:
    def write(directory: Path) -> Path:
        path = directory / name
        path.write_bytes(data)
        return path

    return write


def text_pdf(pages: list[str], *, encrypted: bool = False) -> bytes:
    """每个字符串一页、带文字层的 PDF（fpdf2 的内置 Helvetica）。

    ``encrypted`` 时按标准安全处理器用 RC4 加密，打开要用户密码 ``pw``。
    """
    from fpdf import FPDF
    from fpdf.enums import EncryptionMethod

    pdf = FPDF()
    pdf.set_font("helvetica", size=14)
    for text in pages:
        pdf.add_page()
        pdf.cell(text=text)
    if encrypted:
        pdf.set_encryption(owner_password="owner", user_password="pw",  # noqa: S106 - 样例文件的密码
                           encryption_method=EncryptionMethod.RC4)
    return bytes(pdf.output())


def parse_cases() -> dict[str, Callable[[Path], Path]]:
    whole = text_pdf(["Tender requirements", "Second page"])
    return {
        "zero-byte.txt": _bytes("empty.txt", b""),
        "truncated.pdf": _bytes("cut.pdf", whole[: len(whole) // 2]),
        "encrypted.pdf": _bytes("secret.pdf", text_pdf(["Confidential"], encrypted=True)),
        "pixel-bomb.png (20000x20000)": lambda d: hostile_samples.pixel_bomb_png(d / "bomb.png", side=20000),
        "zip-bomb.docx (400 MB XML)": lambda d: hostile_samples.zip_bomb_docx(d / "bomb.docx", megabytes=400),
        "zip-bomb.docx (40 MB XML)": lambda d: hostile_samples.zip_bomb_docx(d / "small-bomb.docx", megabytes=40),
        "zip-bomb.xlsx (4x80 MB)": lambda d: hostile_samples.zip_bomb_xlsx(d / "bomb.xlsx", sheets=4,
                                                                           megabytes_per_sheet=80),
        "one-line.txt (30 MB)": lambda d: hostile_samples.one_line_text(d / "line.txt", megabytes=30),
        "unpunctuated-zh.txt (2 MB)": lambda d: hostile_samples.unpunctuated_chinese(d / "zh.txt", megabytes=2),
        "nested.html (100000 levels)": lambda d: hostile_samples.nested_html(d / "deep.html", depth=100_000),
        "gbk.txt": _bytes("gbk.txt", "投标人须具备信息系统集成资质。".encode("gbk")),
        "big5.txt": _bytes("big5.txt", "投標人須具備資訊系統整合資質。".encode("big5")),
    }


class _UsageRecorder:
    """失败时 parse_isolated 抛异常、不返回用量：从它的 parse_sandbox_finished 日志事件里取峰值 RSS。"""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.last_rss_mb = 0.0

    def info(self, event: str, **fields: Any) -> None:
        if event == "parse_sandbox_finished":
            self.last_rss_mb = float(fields["max_rss_mb"])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def run_parse_cases() -> None:
    recorder = _UsageRecorder(sandbox.logger)
    sandbox.logger = recorder
    print("| 文件 | 磁盘大小 | 结果 | 解析耗时 (s) | 子进程峰值 RSS (MB) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as directory:
        for label, make in parse_cases().items():
            path = make(Path(directory))
            started = time.perf_counter()
            try:
                result = parse_isolated(path, filename=path.name, ocr=None, limits=parse_limits(),
                                        memory_limit=settings.INGEST_PARSE_MEMORY, timeout=settings.INGEST_TIMEOUT)
                outcome = f"completed（{sum(len(s.text) for s in result.parsed.segments):,} 字符）"
            except ParseError as exc:
                outcome = f"failed：{exc.message[:140]}"
            elapsed = time.perf_counter() - started
            print(f"| {label} | {path.stat().st_size / MB:.2f} MB | {outcome} | {elapsed:.2f} "
                  f"| {recorder.last_rss_mb:.0f} |", flush=True)
            path.unlink()


_CHUNK_SCRIPT = """
import json, sys, time
from raglib.chunking import chunk_text, ChunkingOptions, Tokenizer
from documents.sandbox import peak_rss
kind, size, strategy = sys.argv[1], int(sys.argv[2]), sys.argv[3]
unit = ("the quick brown fox jumps over the lazy dog and keeps running " if kind == "en"
        else "招标文件投标人资格要求评分办法合同条款技术规格服务期限付款方式质量保证售后维护项目预算采购需求")
text = (unit * (size // len(unit) + 1))[:size]
tokenizer = Tokenizer.load(None)
tokenizer.count("预热")
baseline = peak_rss()
started = time.perf_counter()
drafts = chunk_text(text, ChunkingOptions(strategy=strategy), tokenizer=tokenizer)
print(json.dumps({"chunks": len(drafts), "seconds": time.perf_counter() - started,
                  "extra_mb": (peak_rss() - baseline) / 2**20}))
"""


def run_chunk_cases() -> None:
    print("\n| 文本 | 策略 | 分块数 | 分块耗时 (s) | RSS 增量 (MB) |")
    print("|---|---|---|---|---|")
    cases = [("en", 9_500_000, "token"), ("en", 9_500_000, "parent_child"), ("en", 9_500_000, "recursive"),
             ("zh", 2_000_000, "token"), ("zh", 2_000_000, "recursive")]
    for kind, size, strategy in cases:
        completed = subprocess.run(  # noqa: S603 - 参数全部由本脚本构造
            [sys.executable, "-c", _CHUNK_SCRIPT, kind, str(size), strategy],
            capture_output=True, check=True, cwd=ROOT)
        row = json.loads(completed.stdout)
        label = f"{size / 1e6:.1f} M 字符单行英文" if kind == "en" else f"{size / 1e6:.1f} M 字无标点中文"
        print(f"| {label} | {strategy} | {row['chunks']:,} | {row['seconds']:.1f} | {row['extra_mb']:.0f} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-chunking", action="store_true", help="只测解析用例")
    args = parser.parse_args()
    run_parse_cases()
    if not args.skip_chunking:
        run_chunk_cases()


if __name__ == "__main__":
    main()
