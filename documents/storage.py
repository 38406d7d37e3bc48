"""原始上传文件在 RAG_DATA_DIR 下的存放位置（按知识库分目录，便于整库清理）。"""

from __future__ import annotations

import uuid
from pathlib import Path

from django.conf import settings


def knowledge_base_files_dir(kb_id: uuid.UUID) -> Path:
    """某个知识库的原始文件目录（可能尚不存在）。"""
    return Path(settings.DATA_DIR) / "files" / str(kb_id)
