"""一次摄取尝试已经算好的向量，在只差入库这一步失败时暂存到数据目录，下一次尝试直接复用。

数据库在 store 阶段断开（重启、故障切换）是暂时性失败：文档按 30/60/120 s 退避重试。embedding 往往是
整个摄取里最贵的一步，重试时不该重算。暂存文件按分块文本的 SHA-256（与重新索引复用旧向量的键相同）
保存向量，放在知识库的原始文件目录下，随知识库清理一并删除；文档完成或最终失败时删掉。
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import structlog

from documents.models import Document
from documents.storage import knowledge_base_files_dir

logger = structlog.get_logger(__name__)


def _stash_path(document: Document) -> Path:
    return knowledge_base_files_dir(document.knowledge_base_id) / f"{document.id}.vectors.npz"


def vectors_stash(*, document: Document, vectors: Mapping[str, np.ndarray]) -> None:
    """把本次尝试的 text_hash → 向量写入暂存文件；先写临时文件再改名，不会留下半个文件。"""
    if not vectors:
        return
    path = _stash_path(document)
    partial = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("wb") as out:
            np.savez(out, hashes=np.array(list(vectors)),
                     vectors=np.vstack(list(vectors.values())).astype(np.float32))
        os.replace(partial, path)
    except OSError:
        # 暂存只是省下重算的工夫：磁盘满等情况下放弃暂存，重试时照常重算，不影响失败的记录与重试安排
        partial.unlink(missing_ok=True)
        logger.warning("ingest_vectors_stash_failed", exc_info=True)
        return
    logger.info("ingest_vectors_stashed", vectors=len(vectors))


def vectors_unstash(*, document: Document, dimension: int) -> dict[str, np.ndarray]:
    """暂存的 text_hash → 向量；没有暂存、维度不符（知识库换了模型）或文件损坏时返回空表。"""
    path = _stash_path(document)
    if not path.exists():
        return {}
    try:
        with np.load(path) as stash:
            hashes, vectors = stash["hashes"], stash["vectors"]
    except (OSError, ValueError, KeyError):
        logger.warning("ingest_vectors_stash_unreadable", exc_info=True)
        return {}
    if vectors.ndim != 2 or vectors.shape[1] != dimension:
        return {}
    return {str(digest): vector for digest, vector in zip(hashes, vectors, strict=True)}


def vectors_discard(*, document: Document) -> None:
    """文档完成、最终失败或被删除后，暂存的向量不再有用。"""
    _stash_path(document).unlink(missing_ok=True)
