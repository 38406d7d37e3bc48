"""管理命令共用的 ``--kb`` 选项：知识库的名称或 id → 知识库，找不到就以命令错误退出。

``rebuild_fulltext``、``compact_fulltext``、``fit_relevance``、``reindex`` 都接受这个选项，报错的说法一致。
"""

from __future__ import annotations

from django.core.management.base import CommandError

from knowledge.models import KnowledgeBase
from knowledge.selectors import knowledge_base_by_name_or_id


def knowledge_base_option(value: str) -> KnowledgeBase:
    """``--kb`` 的值（名称或 id）对应的知识库；没有就抛 ``CommandError``。"""
    kb = knowledge_base_by_name_or_id(value)
    if kb is None:
        raise CommandError(f"knowledge base {value!r} not found (give its name or id)")
    return kb
