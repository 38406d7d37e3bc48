"""``manage.py fit_relevance``：为知识库拟合相关概率模型（见 ``search.relevance``），打印自测结果。

不需要标注：用知识库自己的分块造伪查询。``--kb`` 指定一个库（id 或名称），不给时拟合全部启用的库；
固定 ``--seed`` 时结果确定。
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from knowledge.management.options import knowledge_base_option
from knowledge.models import KnowledgeBase
from raglib.relevance import MIN_CHUNKS, DropShare
from search.relevance import DEFAULT_QUERIES, DROP_SHARES, relevance_fit


class Command(BaseCommand):
    help = "为知识库拟合相关概率模型（伪查询 + 逻辑回归，不需要标注），打印留出伪查询上的自测结果。"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kb", metavar="KB", help="知识库 id 或名称（默认全部启用的知识库）")
        parser.add_argument("--queries", type=int, default=DEFAULT_QUERIES, help="伪查询条数（默认 %(default)s）")
        parser.add_argument("--seed", type=int, default=0, help="随机种子（默认 0）")
        parser.add_argument("--drop-share", type=float,
                            help="伪查询从原句里去掉的字或词的比例，各方式、各种文字都用它（默认按方式与文字，汉字句 / "
                                 "其他：" + "，".join(f"{mode} {share.han} / {share.other}"
                                                     for mode, share in DROP_SHARES.items()) + "）")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["queries"] < 10:
            raise CommandError("--queries must be at least 10")
        share = options["drop_share"]
        if share is not None and not 0.0 <= share < 1.0:
            raise CommandError("--drop-share must be in [0, 1)")
        if options["kb"]:
            kbs = [knowledge_base_option(options["kb"])]
        else:
            kbs = list(KnowledgeBase.objects.filter(status=KnowledgeBase.Status.ENABLED).order_by("name"))
        for kb in kbs:
            started = time.monotonic()
            profile = relevance_fit(kb=kb, queries=options["queries"], seed=options["seed"],
                                    drop_shares=DROP_SHARES if share is None
                                    else dict.fromkeys(DROP_SHARES, DropShare.both(share)))
            if profile is None:
                self.stdout.write(f"{kb.name}：可检索分块少于 {MIN_CHUNKS} 个，不拟合，沿用全局校准参数")
                continue
            self.stdout.write(f"{kb.name}：{profile.queries} 条伪查询，用时 {time.monotonic() - started:.0f} s")
            self.stdout.write("| 方式 | 去字比例（汉字句 / 其他） | 自测问题数 | MRR 模型 | MRR 原有 | 精确率@0.5 "
                              "| 召回率@0.5 | 无答案时第一名（均值 / ≥0.5 的比例） | 外来问题第一名（均值） |")
            self.stdout.write("|---|---|---|---|---|---|---|---|---|")
            for mode, v in profile.validation.items():
                # 外来问题只有小库拟合时才用（raglib.relevance.SMALL_CHUNKS）
                foreign = f"{v['foreign_top1_mean']:.3f}" if "foreign_top1_mean" in v else "—"
                self.stdout.write(f"| {mode} | {v['drop_share_han']} / {v['drop_share_other']} | {v['queries']} | "
                                  f"{v['mrr_model']:.3f} | {v['mrr_original']:.3f} | "
                                  f"{v['precision']:.3f} | {v['recall']:.3f} | "
                                  f"{v['absent_top1_mean']:.3f} / {v['absent_top1_over_half']:.3f} | {foreign} |")
