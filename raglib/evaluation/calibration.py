"""由评测结果拟合对外分数的全局校准曲线（``raglib.scoring.Calibration``）：前 10 条结果的证据 → 是否标注相关，
做逻辑回归。

没有外部依赖：特征只有一两维，用 :func:`raglib.relevance.fit_logistic`（牛顿法，带很小的 L2）几十步就收敛。
结果是 ``Calibration`` 的字段，给一个新的 embedding 模型建检索画像（``raglib.retrieval_profile.MODEL_PROFILES``）时用。
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raglib.relevance import fit_logistic


def _pairs(per_query: Sequence[dict[str, Any]], qrels: dict[str, dict[str, int]],
           columns: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    rows, labels = [], []
    for record in per_query:
        judged = qrels.get(record["query_id"], {})
        for unit, evidence in zip(record["top10"], record.get("top10_features", []), strict=False):
            values = [evidence[c] for c in columns]
            if any(v is None for v in values):
                continue
            rows.append(values)
            labels.append(1.0 if judged.get(unit, 0) > 0 else 0.0)
    return np.array(rows, dtype=float).reshape(-1, len(columns)), np.array(labels)


def suggest(per_query_by_mode: dict[str, Sequence[dict[str, Any]]],
            qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """各方式拟合出的 ``Calibration`` 字段取值（只拟合数据里有的方式）。"""
    out: dict[str, float] = {}
    for mode, columns in (("vector", [0]), ("fulltext", [1]), ("hybrid", [0, 1])):
        records = per_query_by_mode.get(mode)
        if not records:
            continue
        x, y = _pairs(records, qrels, columns)
        if len(y) < 10 or y.min() == y.max():
            continue
        weights, bias = fit_logistic(x, y)
        if mode == "hybrid":
            out.update({"hybrid_vector": weights[0], "hybrid_fulltext": weights[1], "hybrid_bias": bias})
        elif weights[0] > 0:
            # sigmoid(a·x + b) = sigmoid((x - center)/scale)：center = -b/a，scale = 1/a
            out[f"{mode}_center"] = -bias / weights[0]
            out[f"{mode}_scale"] = 1 / weights[0]
    return {key: round(float(value), 4) for key, value in out.items()}
