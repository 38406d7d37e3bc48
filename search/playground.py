"""检索调试页（维护人员用）：在管理后台里提交一次检索，查看每条结果的各路名次、分数与各阶段耗时。

视图保持很薄：表单校验输入并构造 :class:`~search.services.SearchRequest`，视图调用
:func:`search.services.search` 后渲染。这里的其他函数只把检索结果翻译成页面上的中文说明。
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from documents.filters import SearchFilters
from knowledge.models import KnowledgeBase
from search import profiles, services

MODE_CHOICES = [("hybrid", "混合（向量 + 全文）"), ("vector", "仅向量"), ("fulltext", "仅全文")]
ORDER_CHOICES = [("score", "按分数"), ("position", "按文档位置")]
TAG_MATCH_CHOICES = [("any", "包含任一标签"), ("all", "包含全部标签")]
# 标签之间允许用英文逗号、中文逗号或顿号分隔
TAG_SEPARATORS = re.compile(r"[,，、]")

STAGE_LABELS = {
    "embed": "查询向量化",
    "vector": "向量检索",
    "fulltext": "全文检索",
    "fuse": "RRF 融合",
    "rerank": "重排序",
    "total": "总计",
}
QUERY_TYPE_LABELS = {"plain": "普通", "phrase": "短语", "boolean": "布尔", "exact": "精确"}
VECTOR_METHOD_LABELS = {"exact": "精确扫描（exact）", "hnsw": "HNSW 索引（hnsw）"}
DEGRADED_LABELS = {
    "fulltext-only": "向量路不可用（查询向量化或向量检索失败），只用了全文检索结果",
    "vector-only": "全文检索失败，只用了向量检索结果",
    "no-retrieval": "两路召回都不可用，没有结果",
    "rerank-unavailable": "重排序服务不可用，保留了融合顺序",
}
FOUND_BY_LABELS = {("vector",): "向量", ("fulltext",): "全文", ("vector", "fulltext"): "两路"}


class PlaygroundForm(forms.Form):
    """调试页的输入：只能选启用状态的知识库；top_k 上限取自 RAG_MAX_TOP_K。"""

    knowledge_base = forms.ModelChoiceField(
        queryset=KnowledgeBase.objects.filter(status=KnowledgeBase.Status.ENABLED).order_by("name"),
        label="知识库", empty_label=None,
    )
    query = forms.CharField(label="查询", max_length=4000,
                            help_text="\"…\" 为短语/精确匹配；OR、-词 为布尔查询")
    mode = forms.ChoiceField(label="模式", choices=MODE_CHOICES, initial="hybrid")
    top_k = forms.IntegerField(label="返回条数", min_value=1, initial=5)
    rerank = forms.BooleanField(label="重排序", required=False, initial=True,
                                help_text="RAG_RERANK_PROVIDER=none 时不生效")
    return_parent = forms.BooleanField(label="返回父块文本", required=False, initial=True)
    order = forms.ChoiceField(label="排序", choices=ORDER_CHOICES, initial="score")
    domain = forms.CharField(label="领域（domain）", required=False, max_length=256)
    category = forms.CharField(label="分类（category）", required=False, max_length=256)
    tags = forms.CharField(label="标签", required=False, max_length=2000, help_text="多个标签用逗号分隔")
    tags_match = forms.ChoiceField(label="标签匹配", choices=TAG_MATCH_CHOICES, initial="any", required=False,
                                   widget=forms.RadioSelect)
    filename = forms.CharField(label="文件名", required=False, max_length=256, help_text="与文件名完全相同")
    min_score = forms.FloatField(label="最低分", required=False, min_value=0.0, max_value=1.0,
                                 help_text="只显示得分不低于此值的结果（0~1；不重排时 0.5 表示相关与不相关一样可能）")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # 上限在实例化时读取设置（测试与运行时调整都能生效），所以替换字段而不是在类上写死
        self.fields["top_k"] = forms.IntegerField(
            label="返回条数", min_value=1, max_value=settings.MAX_TOP_K, initial=5,
            help_text=f"1 到 {settings.MAX_TOP_K}（RAG_MAX_TOP_K）",
        )

    def clean_tags(self) -> list[str]:
        raw: str = self.cleaned_data.get("tags") or ""
        return list(dict.fromkeys(tag.strip() for tag in TAG_SEPARATORS.split(raw) if tag.strip()))

    def search_request(self) -> services.SearchRequest:
        """把校验过的输入翻译成检索请求（只能在 is_valid() 之后调用）。"""
        data = self.cleaned_data
        tags = tuple(data["tags"])
        match_all = data.get("tags_match") == "all"
        filters = SearchFilters(
            domains=(data["domain"],) if data["domain"] else (),
            categories=(data["category"],) if data["category"] else (),
            tags_any=() if match_all else tags,
            tags_all=tags if match_all else (),
            filenames=(data["filename"],) if data["filename"] else (),
        )
        return services.SearchRequest(
            query=data["query"], top_k=data["top_k"], mode=data["mode"], rerank=data["rerank"],
            return_parent=data["return_parent"], order=data["order"], filters=filters, min_score=data["min_score"],
        )


# 相关概率模型的特征（raglib.relevance）在调试页上的名字
FEATURE_LABELS = {
    "similarity": "余弦相似度", "similarity_gap": "与最好一条的相似度差",
    "similarity_lift": "比第 10 名高出的相似度", "vector_rank": "向量名次（对数）",
    "match": "全文匹配程度", "match_share": "匹配程度占最好一条的比例", "fulltext_rank": "全文名次（对数）",
    "coverage": "查询在库中的覆盖率", "both": "两路都找到", "fused_rank": "RRF 名次（对数）",
    "calibrated": "全局校准的对数几率（混合方式的模型在它上面校准）",
    "proximity": "邻近程度（最集中的一句话装下的查询份额）",
}


@dataclass(frozen=True)
class ResultRow:
    """结果表的一行：名次、结果本身、“由哪一路找到”的中文说明，以及得分所用的特征（名字, 取值）。"""

    rank: int
    result: services.SearchResult
    found_by: str
    features: list[tuple[str, float]]


def feature_rows(result: services.SearchResult) -> list[tuple[str, float]]:
    return [(FEATURE_LABELS.get(name, name), value) for name, value in (result.features or {}).items()]


@dataclass(frozen=True)
class TimingRow:
    stage: str
    label: str
    ms: float
    percent: float  # 占总耗时的百分比（0 到 100），用来画条形


def found_by_label(result: services.SearchResult) -> str:
    return FOUND_BY_LABELS.get(tuple(result.found_by), "—")


def timing_rows(timings_ms: dict[str, float]) -> list[TimingRow]:
    """按流水线顺序列出各阶段耗时；向量路与全文路并行执行，所以各阶段之和可能大于总计。"""
    total = timings_ms.get("total") or max(timings_ms.values(), default=0.0)
    order = [*STAGE_LABELS, *sorted(set(timings_ms) - set(STAGE_LABELS))]
    return [
        TimingRow(stage, STAGE_LABELS.get(stage, stage), timings_ms[stage],
                  min(100.0, timings_ms[stage] / total * 100) if total else 0.0)
        for stage in order if stage in timings_ms
    ]


def model_source_label(kb: KnowledgeBase, mode: str) -> str:
    """``mode`` 方式的分数学自哪里：本库的模型、同一 embedding 模型的另一个库的模型（本库还没有自己的），或全局校准
    （没有任何模型；或有模型而其中没有这种方式的，比如 3~4 个分块的库没有全文方式的模型）。"""
    source = profiles.model_source(kb.id)
    if source is None:
        return "全局校准（本库与同模型的库都还没有学好的模型）"
    if profiles.relevance_model(kb.id, mode) is None:
        return f"全局校准（模型里没有 {mode} 方式的：伪查询学不出）"
    if source == kb.id:
        return "本库模型"
    other = KnowledgeBase.objects.filter(id=source).values_list("name", flat=True).first()
    return f"同模型知识库“{other}”的模型（本库还没有自己的）"


def degraded_messages(reasons: list[str]) -> list[tuple[str, str]]:
    return [(reason, DEGRADED_LABELS.get(reason, reason)) for reason in reasons]


@staff_member_required
def playground(request: HttpRequest) -> HttpResponse:
    """GET 无参数时只显示表单；带查询参数（可收藏的链接）时执行检索并显示结果。"""
    form = PlaygroundForm(request.GET or None)
    context: dict[str, Any] = {**admin.site.each_context(request), "title": "检索调试", "form": form}
    if form.is_valid():
        kb = form.cleaned_data["knowledge_base"]
        search_request = form.search_request()
        outcome = services.search(kb, search_request)
        context.update(
            outcome=outcome,
            model_source=model_source_label(kb, search_request.mode),
            rows=[ResultRow(rank, result, found_by_label(result), feature_rows(result))
                  for rank, result in enumerate(outcome.results, start=1)],
            timings=timing_rows(outcome.timings_ms),
            degraded=degraded_messages(outcome.degraded),
            query_type=QUERY_TYPE_LABELS.get(outcome.query_type or "", outcome.query_type or "—"),
            vector_method=VECTOR_METHOD_LABELS.get(outcome.vector_method or "", outcome.vector_method or "未执行"),
        )
    return render(request, "search/playground.html", context)
