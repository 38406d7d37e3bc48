"""派生评测数据集（BEIR 格式）的读写：逐行改写 JSONL、原样复制其余文件。``bench/derive_*.py`` 共用。"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def rewrite_jsonl(source: Path, target: Path, name: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """``source/name`` 的每一行交给 ``change``，结果写到 ``target/name``（空行跳过）；源文件不存在时什么也不做。"""
    if not (source / name).exists():
        return
    with (source / name).open(encoding="utf-8") as src, (target / name).open("w", encoding="utf-8") as dst:
        for line in src:
            if line.strip():
                dst.write(json.dumps(change(json.loads(line)), ensure_ascii=False) + "\n")


def copy_files(source: Path, target: Path, names: Iterable[str]) -> None:
    """原样复制 ``names`` 里源目录有的文件。"""
    for name in names:
        if (source / name).exists():
            shutil.copyfile(source / name, target / name)
