"""原始上传文件在 RAG_DATA_DIR 下的存放位置（按知识库分目录，便于整库清理）。"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from django.conf import settings

# 本服务在知识库目录里写下的文件名：``<文档 id><扩展名>``（原始文件，扩展名是上传文件名的小写扩展名，可以没有）、
# ``<文档 id>.vectors.npz``（暂存的向量，documents.vector_stash），写入过程中还有加 ``.partial`` 的临时文件
_OWNED_NAME = re.compile(
    r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(?:\.vectors\.npz|\.[0-9a-z]{1,16})?(?:\.partial)?"
)


def knowledge_base_files_dir(kb_id: uuid.UUID) -> Path:
    """某个知识库的原始文件目录（可能尚不存在）。"""
    return Path(settings.DATA_DIR) / "files" / str(kb_id)


def owned_file_document(name: str) -> uuid.UUID | None:
    """知识库目录里一个文件名是本服务按上面的规则写下的，就返回它所属文档的 id，否则 None。"""
    match = _OWNED_NAME.fullmatch(name)
    return uuid.UUID(match.group(1)) if match else None
