"""``MemoryCollection``: a ``MemoryStore`` of one in-process ``TemporalMemory`` per conversation.

The evaluation harness (``tider eval retrieval|qa|compare``), the GRPO rewards and the
training prompts read a dataset's memories through this, so they run the query path users
run (docs/design.md, decision 12). It needs the memories only, never the queries or their
gold: a query is searched by its public part. Each memory is built on first use from the
loaded ``Memory`` (messages in its time order, so a message's position is its ``id``
there and gold evidence ids line up); one embedder (and its on-disk cache) serves all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from tider.memory.store import Ranking
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

    # -- tider.memory.store.MemoryStore --------------------------------------------------
    def names(self) -> list[str]:
        return list(self.memories)

    def messages(self, name: str) -> Memory:
        return self.get(name).messages()

    def timeline(self, name: str):
        return self.get(name).timeline()

    def prepare(self, queries: Iterable[Query]) -> None:
        """Embed all query texts in one batch (fills the embedding cache)."""
        texts = list(dict.fromkeys(q.text for q in queries))
        if texts:
            self.embedder.encode(texts)

    def _public(self, query: Query) -> tuple[TemporalMemory, Query]:
        mem = self.get(query.memory_key)
        return mem, mem.query(query.text, query.asked_at, query.user)

    def retrieve(
        self, query: Query, prediction: WindowPrediction, k: int | None = None, mode: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Dual-channel ``(positions, scores)``, best first, for an already-made prediction."""
        mem, public = self._public(query)
        return mem.retrieve(public, prediction, k, mode)

    def ranking(self, query: Query, mode: str | None = None) -> Ranking:
        """The semantic channel over the messages the query may see (its past), exact."""
        mem, public = self._public(query)
        return mem.ranking(public, mode, exact=True)
