"""The memories a service holds open, bounded: at most ``limit`` (the least recently used is
closed first, its derived indexes persisted and its store released), never one that a
request is using. Each request leases the memory it names for its duration."""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

DEFAULT_LIMIT = 256  # open memories a service keeps (TIDER_MAX_OPEN_MEMORIES)


class OpenMemories:
    def __init__(self, open_memory: Callable, limit: int = DEFAULT_LIMIT):
        if limit < 1:
            raise ValueError(f"the open-memory limit must be at least 1, got {limit}")
        self._open = open_memory  # (name, create) -> an open memory; raises for a missing one
        self.limit = limit
        self._lock = threading.Lock()  # opening and closing are serialized: one instance a store
        self._held: OrderedDict[str, object] = OrderedDict()
        self._leases: Counter[str] = Counter()

    @contextmanager
    def lease(self, name: str, create: bool) -> Iterator:
        """The open memory ``name`` (opened, or created with ``create``, if it is not open),
        kept open until the block ends."""
        with self._lock:
            if name not in self._held:
                self._held[name] = self._open(name, create)
            self._held.move_to_end(name)
            self._leases[name] += 1
            self._close_idle()
            memory = self._held[name]
        try:
            yield memory
        finally:
            with self._lock:
                self._leases[name] -= 1

    def _close_idle(self) -> None:
        """Close the least recently used memories no request is using, down to the limit."""
        for name in list(self._held):
            if len(self._held) <= self.limit:
                return
            if not self._leases[name]:
                self._held.pop(name).close()
                del self._leases[name]

    def names(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def close(self) -> None:
        with self._lock:
            for memory in self._held.values():
                memory.close()
            self._held.clear()
