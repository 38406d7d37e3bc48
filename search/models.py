"""search 应用的模型：全文引擎的知识库统计行，与每个知识库学出来的相关概率模型。

全文引擎的其余表（L0、段、词典、倒排块、序号、删除集）没有模型：它们由 ``search/sql/`` 里的 SQL 建立，
由触发器与 :mod:`search.segments` 读写，应用只经 :mod:`search.bm25` 读它们。
"""

from __future__ import annotations

from django.db import models

from knowledge.models import KnowledgeBase


class FulltextKbStats(models.Model):
    """全文引擎的知识库统计行：合并进段的分块数与词数之和（含删除集里还没清掉的），下一个序号与段号。

    只由合并（:mod:`search.segments`）写：写入分块不碰这一行。查询时 N = chunk_count + L0 - 删除集（总词数同理），
    见 :mod:`search.bm25`。这一行不在 = 这个知识库没有全文数据（整库清理的快路，见 ``search.segments.drop``）。
    """

    knowledge_base = models.OneToOneField(KnowledgeBase, on_delete=models.CASCADE, primary_key=True,
                                          related_name="fulltext_stats", verbose_name="知识库")
    chunk_count = models.BigIntegerField("分块数", default=0)
    total_length = models.BigIntegerField("词数之和", default=0)
    # 下一个分块序号与段号：只由合并（search.segments）分配与推进
    next_ordinal = models.IntegerField("下一个分块序号", default=0, db_default=0)
    next_segment = models.IntegerField("下一个段号", default=0, db_default=0)

    class Meta:
        db_table = "fulltext_kb_stats"
        verbose_name = "全文统计"
        verbose_name_plural = "全文统计"

    def __str__(self) -> str:
        return f"{self.knowledge_base_id}: {self.chunk_count} chunks"


class RelevanceProfile(models.Model):
    """一个知识库不用标注学出来的相关概率模型（见 ``raglib.relevance`` 与 ``search.relevance``）。

    每种检索方式一个逻辑回归（``mode_models``，JSON；混合方式是全局校准之上的单调校准，不改名次）；``validation``
    是拟合时在留出的伪查询上的自测：模型排序与原有排序的 MRR、0.5 阈值下的精确率与召回率、拿掉答案后第一名的分数。
    还没有自己模型的库借同一 ``embedding_model`` 里分块最多的那个库的（``search.profiles``）。
    """

    knowledge_base = models.OneToOneField(KnowledgeBase, on_delete=models.CASCADE, primary_key=True,
                                          related_name="relevance_profile", verbose_name="知识库")
    embedding_model = models.CharField("拟合时的 embedding 模型", max_length=300)
    mode_models = models.JSONField("各方式的模型", default=dict)
    # 分块的汉字写法（hans 简体、hant 繁体，汉字太少时为空）：向量一路先把问题转成这种写法再算向量
    script = models.CharField("汉字写法", max_length=8, blank=True, default="")
    chunk_count = models.BigIntegerField("拟合时的可检索分块数")
    # 拟合时已完成文档的 chunk_count 之和（含父块）：search.relevance.profiles_due 拿它与现在的同一个和相比，
    # 判断库变了多少。不能拿 chunk_count 比——父子分块的库两者总差着父块，没有变化也每隔十分钟重新拟合一次。
    # 这个字段之前拟合的模型为空：它们的 revision 也旧，定时检查照样重新拟合、补上
    document_chunk_count = models.BigIntegerField("拟合时文档表上的分块数（含父块）", null=True, blank=True)
    # 拟合做法的版本（raglib.relevance.MODEL_REVISION）：记在整个模型上，一种方式也没学出的库（mode_models 为空）
    # 做法变了也认得出来要重新拟合。这个字段之前拟合的为 0
    revision = models.PositiveIntegerField("拟合做法的版本", default=0)
    queries = models.PositiveIntegerField("伪查询数")
    seed = models.IntegerField("随机种子")
    validation = models.JSONField("自测结果", default=dict)
    fitted_at = models.DateTimeField("拟合时间", auto_now=True)

    class Meta:
        db_table = "search_relevance_profiles"
        verbose_name = "相关概率模型"
        verbose_name_plural = "相关概率模型"

    def __str__(self) -> str:
        return f"{self.knowledge_base_id}: {self.queries} pseudo-queries"
