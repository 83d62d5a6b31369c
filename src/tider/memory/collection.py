"""``MemoryCollection``: one in-process ``TemporalMemory`` per conversation.

The evaluation harness (``tider eval retrieval|qa|compare``), the GRPO rewards and the
window sources that need indexes search through this, so they run the query path users
run (DESIGN decision 12). It needs the memories only, never the queries or their gold:
a query is searched by its public part. Each memory is built on first use from the
loaded ``Memory`` (messages in its time order, so a message's position is its ``id``
there and gold evidence ids line up); one embedder (and its on-disk cache) serves all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from tider.memory.temporal_memory import TemporalMemory
from tider.retrieval.config import RetrievalConfig
from tider.types import Memory, Query, WindowPrediction


class MemoryCollection:
    def __init__(self, memories: Mapping[str, Memory], config: RetrievalConfig | None = None, embedder=None):
        from tider.retrieval.embed import Embedder

        self.memories = dict(memories)
        self.config = config or RetrievalConfig()
        self.embedder = embedder or Embedder(self.config.embedding_model, self.config.embedding_cache_dir)
        self._built: dict[str, TemporalMemory] = {}

    @property
    def granularity(self) -> str:
        return next(iter(self.memories.values())).granularity if self.memories else "day"

    def get(self, memory_key: str) -> TemporalMemory:
        if memory_key not in self._built:
            if memory_key not in self.memories:
                raise KeyError(f"memory {memory_key!r} not in this collection ({len(self.memories)} memories)")
            source = self.memories[memory_key]
            if not len(source):
                raise ValueError(f"memory {memory_key!r} has no messages: nothing to index or retrieve")
            mem = TemporalMemory(
                None, config=self.config, embedder=self.embedder, name=memory_key, granularity=source.granularity
            )
            mem.add(source.messages)
            if len(mem) != len(source):
                raise ValueError(
                    f"memory {memory_key!r}: message keys repeat ({len(source)} messages, {len(mem)} distinct keys)"
                )
            self._built[memory_key] = mem
        return self._built[memory_key]

    # What window sources and the harness read, per memory key.
    def indexes(self, memory_key: str) -> TemporalMemory:
        return self.get(memory_key)

    def memory(self, memory_key: str) -> Memory:
        return self.get(memory_key).memory

    def timeline(self, memory_key: str):
        return self.get(memory_key).timeline

    def prepare(self, queries: Iterable[Query]) -> None:
        """Embed all query texts in one batch (fills the embedding cache)."""
        texts = list(dict.fromkeys(q.text for q in queries))
        if texts:
            self.embedder.encode(texts)

    def retrieve(
        self, query: Query, prediction: WindowPrediction, k: int | None = None, mode: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Dual-channel ``(positions, scores)``, best first, for an already-made prediction."""
        mem = self.get(query.memory_key)
        ids, scores, _ = mem.rank(
            mem.query(query.text, query.asked_at, query.user),
            prediction,
            self.config.k if k is None else k,
            semantic=mode,
        )
        return ids, scores

    def similarity(self, query: Query, mode: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact ``(sim, order)`` over the messages the query may see (its past)."""
        mem = self.get(query.memory_key)
        q = mem.query(query.text, query.asked_at, query.user)
        part = mem.semantic_part(q, None, True, mode or self.config.semantic, mem.cut(q.asked_at))
        return part.sim, part.order
