"""摄取流水线的阶段：显示名与处理中文档的进度（管理后台的文档列表用）。"""

from __future__ import annotations

from dataclasses import dataclass

# 摄取流水线的阶段与显示名（进度条按它的位置计算）
STAGE_LABELS = {"parse": "解析与 OCR", "chunk": "分块", "embed": "向量化", "store": "写入"}


@dataclass(frozen=True)
class StageProgress:
    label: str
    step: int  # 0 表示还在排队
    steps: int

    @property
    def percent(self) -> int:
        """进度条宽度：当前阶段算完成一半（排队中为 0）。"""
        return 0 if self.step == 0 else round(100 * (self.step - 0.5) / self.steps)


def stage_progress(stage: str) -> StageProgress:
    """处理中文档的当前阶段 → 第几步/共几步；还没有 worker 开始处理（stage 为空）是第 0 步“排队中”。"""
    stages = list(STAGE_LABELS)
    if stage not in STAGE_LABELS:
        return StageProgress("排队中", 0, len(stages))
    return StageProgress(STAGE_LABELS[stage], stages.index(stage) + 1, len(stages))
