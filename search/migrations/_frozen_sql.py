"""迁移读取 ``search/sql/`` 里冻结的 SQL 文件：按文件名与迁移里记下的 SHA-256 读出，内容变了就拒绝加载。

为什么冻结：迁移是历史，必须在任何时候做同一件事。SQL 放在文件里是为了可读（一个关注点一个文件、带注释），
但文件若还能改，改一次就悄悄改掉了已发布迁移的行为，全新部署与老部署也会从此不同。所以文件一经发布就不再修改：
新版本是新文件加一个应用它的新迁移（规则见 ``search/fulltext.py`` 的说明）。校验和不符时这里直接报错，
``migrate``、``showmigrations`` 与测试建库都会停下；``tests/search/test_engine_sql.py`` 也逐个检查。

只依赖标准库：迁移不导入应用代码（.importlinter 的契约）。以下划线开头，Django 不把它当成迁移。
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"

# 已加载的迁移钉住的文件：文件名 → SHA-256（测试用来确认每个文件都被钉住）
PINNED: dict[str, str] = {}


def read_sql(name: str) -> tuple[str, str]:
    """``search/sql/<name>`` 的内容与它的 SHA-256。换行统一成 LF 再算：Windows 上检出成 CRLF 的文件
    得到同样的校验和，写进数据库的函数体也与别处的部署逐字节相同。"""
    text = (SQL_DIR / name).read_bytes().decode("utf-8").replace("\r\n", "\n")
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest()


def frozen_sql(name: str, sha256: str) -> str:
    """``search/sql/<name>`` 的内容；与 ``sha256`` 不符时抛 RuntimeError。"""
    text, actual = read_sql(name)
    if actual != sha256:
        raise RuntimeError(
            f"search/sql/{name} has changed (sha256 {actual}, a shipped migration pinned {sha256}): "
            "shipped SQL files are immutable; put the new version in a new file applied by a new migration"
        )
    PINNED[name] = sha256
    return text
