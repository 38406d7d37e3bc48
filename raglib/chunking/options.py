"""分块参数与分块结果的数据类型。"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

import numpy as np

__all__ = [
    "AUTO",
    "STRATEGY_DEFAULTS",
    "ChunkDraft",
    "ChunkRole",
    "ChunkStrategy",
    "ChunkingOptions",
    "EmbedFn",
]

ChunkStrategy = Literal["token", "semantic", "recursive", "parent_child", "paragraph"]
ChunkRole = Literal["chunk", "parent", "child"]

# 批量 embedding：输入 n 段文本，返回 (n, d) 的 L2 归一化矩阵
EmbedFn = Callable[[list[str]], np.ndarray]



class _Auto(int):
    """"按策略取默认值"的哨兵：int 的子类实例，靠身份（``is``）识别，调用方显式传入的 -1 不会被误认。"""

    __slots__ = ()

    def __repr__(self) -> str:
        return "AUTO"


# 字段缺省为 AUTO 表示"按 strategy 取默认值"，在 __post_init__ 中替换成具体数值
AUTO: Final[int] = _Auto(-1)

# 各策略的默认参数。recursive 与 paragraph 的 chunk_size/overlap 单位是字符，其余是 token。
STRATEGY_DEFAULTS: Final[dict[str, dict[str, int]]] = {
    "token": {"chunk_size": 512, "overlap": 64, "parent_size": 1024},
    "semantic": {"chunk_size": 512, "overlap": 0, "parent_size": 1024},
    "recursive": {"chunk_size": 1000, "overlap": 200, "parent_size": 1024},
    "parent_child": {"chunk_size": 256, "overlap": 32, "parent_size": 1024},
    "paragraph": {"chunk_size": 1000, "overlap": 200, "parent_size": 1024},
}


@dataclass(frozen=True)
class ChunkingOptions:
    """一次分块的全部参数；构造后不可变，``validate()`` 给出清晰的错误信息。

    - ``chunk_size``：token 策略为每块最大 token 数；semantic 为强制切分的上限（token）；
      recursive 与 paragraph 为每块最大**字符**数；parent_child 为子块最大 token 数。
    - ``overlap``：相邻块的重叠上限（recursive 为字符，其余为 token）；semantic 不使用。
    - ``parent_size``：parent_child 的父块最大 token 数（父块之间不重叠）。
    - ``cliff_percentile``：semantic 的断崖分位数（默认第 20 百分位）。
    - ``min_chunk_tokens``：semantic 可选的小块合并阈值（0 表示关闭）。

    ``chunk_size``/``overlap``/``parent_size`` 缺省为 ``AUTO``，按 strategy 取
    ``STRATEGY_DEFAULTS`` 中的值，所以 ``ChunkingOptions(strategy="recursive").chunk_size == 1000``。
    """

    strategy: ChunkStrategy = "token"
    chunk_size: int = AUTO
    overlap: int = AUTO
    parent_size: int = AUTO
    cliff_percentile: float = 20.0
    min_chunk_tokens: int = 0

    def __post_init__(self) -> None:
        defaults = STRATEGY_DEFAULTS.get(self.strategy, STRATEGY_DEFAULTS["token"])
        for name, value in defaults.items():
            if getattr(self, name) is AUTO:
                # frozen dataclass 只能在这里用 object.__setattr__ 补默认值
                object.__setattr__(self, name, value)

    @classmethod
    def for_strategy(cls, strategy: str, **overrides: Any) -> ChunkingOptions:
        """某个策略的默认参数，再叠加 ``overrides``。

        未知策略抛 ``ValueError``；未知参数名抛 ``TypeError``（与 dataclass 构造一致）。
        """
        if strategy not in STRATEGY_DEFAULTS:
            raise ValueError(_unknown_strategy(strategy))
        return cls(strategy=strategy, **overrides)  # type: ignore[arg-type]

    def validate(self) -> None:
        """参数合法性检查；任一项不合法抛 ``ValueError``，消息指明字段与取值。"""
        if self.strategy not in get_args(ChunkStrategy):
            raise ValueError(_unknown_strategy(self.strategy))
        for name in ("chunk_size", "overlap", "parent_size", "min_chunk_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        unit = "characters" if self.strategy in ("recursive", "paragraph") else "tokens"
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0 {unit}, got {self.chunk_size}")
        if not 0 <= self.overlap < self.chunk_size:
            raise ValueError(
                f"overlap must satisfy 0 <= overlap < chunk_size ({self.chunk_size} {unit}), got {self.overlap}"
            )
        if self.strategy == "parent_child" and self.parent_size < self.chunk_size:
            raise ValueError(
                f"parent_size ({self.parent_size}) must be >= chunk_size ({self.chunk_size}) for parent_child"
            )
        percentile = self.cliff_percentile
        if isinstance(percentile, bool) or not isinstance(percentile, int | float) or not 0 <= percentile <= 100:
            raise ValueError(f"cliff_percentile must be a number in [0, 100], got {percentile!r}")
        if not 0 <= self.min_chunk_tokens <= self.chunk_size:
            raise ValueError(
                f"min_chunk_tokens must satisfy 0 <= min_chunk_tokens <= chunk_size ({self.chunk_size}), "
                f"got {self.min_chunk_tokens}"
            )

    def replace(self, **changes: Any) -> ChunkingOptions:
        """``dataclasses.replace`` 的便捷写法。"""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ChunkDraft:
    """一个待入库的分块（尚无 embedding）。

    不变量：``text == markdown[start:end]``（所有策略、所有角色都精确成立），
    且 ``text`` 首尾不是空白字符。``heading_path`` 是 ``start`` 处生效的 Markdown 标题层级；
    ``token_count`` 是 ``text`` 单独编码的内容 token 数。
    ``role == "child"`` 时 ``parent`` 是其父块在返回列表中的下标。
    """

    text: str
    start: int
    end: int
    heading_path: tuple[str, ...]
    token_count: int
    role: ChunkRole = "chunk"
    parent: int | None = None


def _unknown_strategy(strategy: object) -> str:
    allowed = ", ".join(get_args(ChunkStrategy))
    return f"unknown chunking strategy {strategy!r}; expected one of: {allowed}"
