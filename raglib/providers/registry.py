"""按名字登记提供方工厂的注册表；embedding 与重排序各持一个（:mod:`raglib.providers.embedding`、
:mod:`raglib.providers.rerank`）。

注册表实现 ``MutableMapping``，行为同一个 ``dict``：测试可以用 ``monkeypatch.setitem`` 临时登记或替换
一个工厂，结束时自动撤销。
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from typing import TypeVar

F = TypeVar("F")


class Registry(MutableMapping[str, F]):
    """提供方名字 -> 工厂。``kind``（如 ``"embedding"``）只用于错误信息。"""

    def __init__(self, kind: str, factories: Mapping[str, F] | None = None) -> None:
        self.kind = kind
        self._factories: dict[str, F] = dict(factories or {})

    def register(self, name: str, factory: F) -> None:
        """注册（或替换）一种提供方。"""
        self._factories[name] = factory

    def names(self) -> list[str]:
        """已注册的提供方名字，按字母序。"""
        return sorted(self._factories)

    def lookup(self, name: str) -> F:
        """取该名字的工厂；未注册时抛 ``ValueError``，信息里列出已注册的名字。"""
        factory = self._factories.get(name)
        if factory is None:
            raise ValueError(f"unknown {self.kind} provider {name!r}; available: {', '.join(self.names())}")
        return factory

    def copy(self) -> Registry[F]:
        """浅拷贝（测试隔离用：替换模块里的注册表，登记不会漏到别的测试）。"""
        return Registry(self.kind, self._factories)

    def __getitem__(self, name: str) -> F:
        return self._factories[name]

    def __setitem__(self, name: str, factory: F) -> None:
        self._factories[name] = factory

    def __delitem__(self, name: str) -> None:
        del self._factories[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._factories)

    def __len__(self) -> int:
        return len(self._factories)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
