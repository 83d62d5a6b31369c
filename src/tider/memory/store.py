"""``MemoryStore``: the one interface to stored memories that window sources, the
evaluation harness and the GRPO rewards read.

A store holds one or more named memories (``names()``); a query names its memory
(``Query.memory_key``). What a reader may ask of it:

- ``messages(name)``: the memory's messages in time order (a ``tider.types.Memory``: a
  message's ``id`` is its position, so a window is a contiguous id range);
- ``timeline(name)``: its event clusters (``tider.retrieval.timeline.Timeline``);
- ``ranking(query, mode)``: the semantic channel's ranking of what the query may see
  (``Ranking``: positions best first, with their similarity), the input of
  retrieve-then-localize window sources;
- ``retrieve(query, prediction, k, mode)``: the dual-channel top k for a prediction;
- ``prepare(queries)``: embed query texts in one batch (a hint; may do nothing).

A memory (``tider.memory.base.MemoryBase``: embedded or PostgreSQL) is a store of one
memory (its own ``name``); ``MemoryCollection`` holds one in-process memory per
conversation of a dataset.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from tider.retrieval.config import RetrievalConfig
    from tider.retrieval.timeline import Timeline
    from tider.types import Memory, Query, WindowPrediction


class Ranking(NamedTuple):
    """The semantic channel for one query: ``ids`` (positions, best first, ties by lower
    position) and their ``sim`` in [0, 1]. Exact scoring ranks every visible message; the
    index-backed path ranks its candidates."""

    ids: np.ndarray
    sim: np.ndarray


@runtime_checkable
class MemoryStore(Protocol):
    config: RetrievalConfig

    def names(self) -> list[str]: ...

    def messages(self, name: str) -> Memory: ...

    def timeline(self, name: str) -> Timeline: ...

    def ranking(self, query: Query, mode: str | None = None) -> Ranking: ...

    def retrieve(
        self, query: Query, prediction: WindowPrediction, k: int | None = None, mode: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def prepare(self, queries: Iterable[Query]) -> None: ...
