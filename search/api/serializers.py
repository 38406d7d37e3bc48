"""检索接口的输入输出格式。"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from documents.filters import SearchFilters
from infra.api import OneOrManyField, SettingBoundedIntegerField, StrictSerializer
from search.services import MODES, SearchRequest


class StringOrListField(OneOrManyField):
    """接受单个字符串或字符串数组（多个值之间是“任一”）。"""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=serializers.CharField(max_length=256), max_length=100, **kwargs)


class SearchFiltersSerializer(StrictSerializer):
    """元数据过滤：字段之间是“且”，同一字段的多个值是“任一”（tags_all 要求全部包含）。"""

    domain = StringOrListField(required=False, help_text="领域（文档元数据 domain），字符串或数组")
    category = StringOrListField(required=False, help_text="分类（文档元数据 category），字符串或数组")
    tags_any = serializers.ListField(child=serializers.CharField(max_length=256), required=False, max_length=100,
                                     help_text="包含其中任一标签")
    tags_all = serializers.ListField(child=serializers.CharField(max_length=256), required=False, max_length=100,
                                     help_text="包含全部标签")
    document_ids = serializers.ListField(child=serializers.UUIDField(), required=False, max_length=1000,
                                         help_text="只在这些文档里检索")
    filename = StringOrListField(required=False, help_text="文件名（完全相同），字符串或数组")


class SearchRequestSerializer(StrictSerializer):
    query = serializers.CharField(max_length=4000, help_text="查询文本；\"…\" 为短语/精确匹配，OR、-词 为布尔查询")
    knowledge_base_id = serializers.CharField(max_length=64, help_text="知识库 id")
    top_k = SettingBoundedIntegerField(setting="MAX_TOP_K", min_value=1, default=5,
                                       help_text="返回条数，默认 5，上限 RAG_MAX_TOP_K（默认 20）")
    mode = serializers.ChoiceField(choices=MODES, default="hybrid", help_text="hybrid（默认）、vector 或 fulltext")
    rerank = serializers.BooleanField(default=True, help_text="是否用重排序模型打分（RAG_RERANK_PROVIDER=none 时忽略）")
    return_parent = serializers.BooleanField(default=True, help_text="父子分块的知识库：是否返回父块文本")
    order = serializers.ChoiceField(choices=("score", "position"), default="score",
                                    help_text="score 按分数降序；position 按文档与文中位置排序（拼接上下文用）")
    filters = SearchFiltersSerializer(required=False)
    min_score = serializers.FloatField(
        required=False, allow_null=True, default=None, min_value=0.0, max_value=1.0,
        help_text="只返回 score 不低于此值的结果（0~1）。不重排时分数是校准过的相关概率，0.5 表示相关与不相关一样可能；"
                  "重排时是重排模型的 sigmoid 分数。不填则不过滤")

    def to_request(self) -> SearchRequest:
        data = self.validated_data
        return SearchRequest(
            query=data["query"], top_k=data["top_k"], mode=data["mode"], rerank=data["rerank"],
            return_parent=data["return_parent"], order=data["order"], filters=_filters(data.get("filters") or {}),
            min_score=data.get("min_score"),
        )


def _filters(data: dict[str, Any]) -> SearchFilters:
    return SearchFilters(
        domains=tuple(data.get("domain", ())),
        categories=tuple(data.get("category", ())),
        tags_any=tuple(data.get("tags_any", ())),
        tags_all=tuple(data.get("tags_all", ())),
        document_ids=tuple(data.get("document_ids", ())),
        filenames=tuple(data.get("filename", ())),
    )


class SearchResultSerializer(serializers.Serializer):
    """一条检索结果：规范的五个字段，外加 chunk_id、metadata 与父块文本（见 docs/INVARIANTS.md 的 RESULT-FIELDS）。"""

    chunk_id = serializers.IntegerField()
    chunk_text = serializers.CharField()
    score = serializers.FloatField(help_text="0~1，越大越相关；得分来源见 README“检索分数”")
    document_id = serializers.UUIDField()
    filename = serializers.CharField()
    chunk_index = serializers.IntegerField()
    metadata = serializers.DictField()
    parent_chunk_id = serializers.IntegerField(required=False, allow_null=True)
    parent_text = serializers.CharField(required=False, allow_null=True,
                                        help_text="父子分块时命中子块所在的父块（过长时为子块周围的窗口）")
