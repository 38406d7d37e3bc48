"""BM25 的知识库级统计：分块数、总词数、每个词位的文档频率。

这两张表只由数据库触发器写（``document_chunks`` 上的语句级 AFTER INSERT/DELETE/UPDATE 触发器，SQL 见
``search/sql/fulltext_stats_maintain.v1.sql`` 与 ``fulltext_stats_apply.v1.sql``）：任何让分块出现或消失的
语句——摄取的 COPY、删除文档、重新索引、知识库清理、后台直接删——都在同一个事务里更新统计，
分块可见的那一刻统计也可见，永远与分块一致，不需要定时任务。
只统计可检索的分块（role ≠ parent）。
"""

from __future__ import annotations

from django.db import models

from knowledge.models import KnowledgeBase


class FulltextKbStats(models.Model):
    """一个知识库的可检索分块数与词数之和（平均文档长度 = total_length / chunk_count）。"""

    knowledge_base = models.OneToOneField(KnowledgeBase, on_delete=models.CASCADE, primary_key=True,
                                          related_name="fulltext_stats", verbose_name="知识库")
    chunk_count = models.BigIntegerField("分块数", default=0)
    total_length = models.BigIntegerField("词数之和", default=0)

    class Meta:
        db_table = "fulltext_kb_stats"
        verbose_name = "全文统计"
        verbose_name_plural = "全文统计"

    def __str__(self) -> str:
        return f"{self.knowledge_base_id}: {self.chunk_count} chunks"


class FulltextTermStats(models.Model):
    """一个知识库里含某词位的可检索分块数（文档频率 df）。词位按 "C" 排序规则比较，前缀查询可走主键范围扫描。"""

    pk = models.CompositePrimaryKey("knowledge_base", "lexeme")
    # 主键的第一列就是知识库，不需要 Django 再为外键建一个索引
    knowledge_base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="+",
                                       db_index=False, verbose_name="知识库")
    lexeme = models.TextField("词位", db_collation="C")
    df = models.BigIntegerField("文档频率")

    class Meta:
        db_table = "fulltext_term_stats"
        verbose_name = "词位文档频率"
        verbose_name_plural = "词位文档频率"

    def __str__(self) -> str:
        return f"{self.lexeme}: {self.df}"


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
