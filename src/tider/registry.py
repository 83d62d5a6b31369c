"""A named registry: the one pattern behind window sources and GRPO rewards.

``register(name)`` is a decorator that refuses a duplicate name; ``get(name)`` fails
with the list of known names instead of a bare KeyError. ``lazy`` maps a name to the
module that registers it on import, so heavy or optional parts load only when asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T", bound=Callable)


class Registry(Generic[T]):
    def __init__(self, kind: str, lazy: Mapping[str, str] | None = None):
        self.kind = kind
        self.lazy = dict(lazy or {})
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def wrap(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered by {self._items[name]!r}")
            self._items[name] = item
            return item

        return wrap

    def known(self) -> list[str]:
        return sorted(set(self._items) | set(self.lazy))

    def __contains__(self, name: str) -> bool:
        return name in self._items or name in self.lazy

    def get(self, name: str) -> T:
        if name not in self._items and name in self.lazy:
            try:
                importlib.import_module(self.lazy[name])
            except ModuleNotFoundError as err:
                raise ValueError(
                    f"{self.kind} {name!r} lives in {self.lazy[name]}, which is not available: {err}"
                ) from err
        if name not in self._items:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.known())}")
        return self._items[name]
