"""``MemoryCollection``: a ``MemoryStore`` of one memory per conversation.

The evaluation harness (``tider eval retrieval|qa|compare``), the GRPO rewards and the
training prompts read a dataset's memories through this, so they run the query path users
run (docs/design.md, decision 12). It needs the memories only, never the queries or their
gold: a query is searched by its public part. Each memory is built on first use from the
loaded ``Memory`` (messages in its time order, so a message's position is its ``id``
there and gold evidence ids line up); one embedder (and its on-disk cache) serves all.

By default each memory lives in the process. With ``store`` (a PostgreSQL URL or a
directory, ``tider.memory.backends``) each is imported there under its
``tider memory import`` name (adding what is missing: a second run adds nothing) and
searched there; a store memory holding other messages than the dataset's is refused, since
positions would not line up with the gold.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping

import numpy as np

from tider.memory.base import MemoryBase
from tider.memory.embedded import EmbeddedMemory
from tider.memory.store import Ranking
from tider.retrieval.config import RetrievalConfig
from tider.types import Memory, Query, WindowPrediction


class MemoryCollection:
    def __init__(
        self,
        memories: Mapping[str, Memory],
        config: RetrievalConfig | None = None,
        embedder=None,
        store: str | os.PathLike | None = None,
        postgres=None,
    ):
        from tider.retrieval.embed import Embedder

        self.memories = dict(memories)
        self.config = config or RetrievalConfig()
        self.embedder = embedder or Embedder(self.config.embedding_model, self.config.embedding_cache_dir)
        self._built: dict[str, MemoryBase] = {}
        # per memory, seconds to build it (embedding, cached vectors read back, the indexes):
        # LongMemEval builds one memory per question, so this is its per-question cost
        self.build_seconds: dict[str, float] = {}
        self.store, self._backend = store, None
        if store is not None:
            from tider.memory.backends import open_backend
            from tider.memory.importer import store_name

            if len({store_name(k) for k in self.memories}) != len(self.memories):
                raise ValueError("memory keys collide as store names (tider.memory.importer.store_name)")
            self._backend = open_backend(store, postgres)  # postgres: a PostgresConfig for a URL

    @property
    def granularity(self) -> str:
        return next(iter(self.memories.values())).granularity if self.memories else "day"

    def get(self, memory_key: str) -> MemoryBase:
        if memory_key not in self._built:
            if memory_key not in self.memories:
                raise KeyError(f"memory {memory_key!r} not in this collection ({len(self.memories)} memories)")
            source = self.memories[memory_key]
            if not len(source):
                raise ValueError(f"memory {memory_key!r} has no messages: nothing to index or retrieve")
            t0 = time.perf_counter()
            mem = self._open(memory_key, source)
            mem.build_indexes()  # here, not at the first search: what a memory costs to index, timed
            self.build_seconds[memory_key] = time.perf_counter() - t0
            self._built[memory_key] = mem
        return self._built[memory_key]

    def _open(self, memory_key: str, source: Memory) -> MemoryBase:
        kwargs = {"config": self.config, "embedder": self.embedder, "granularity": source.granularity}
        if self._backend is None:
            mem = EmbeddedMemory(None, name=memory_key, **kwargs)
        else:
            from tider.memory.importer import store_name

            mem = self._backend.open(store_name(memory_key), **kwargs)
        mem.add(source.messages)
        if len(mem) != len(source):
            raise ValueError(
                f"memory {memory_key!r}: {len(source)} messages in the dataset, {len(mem)} in the memory "
                "(keys repeat, or the store's memory holds others)"
            )
        if self._backend is not None and [m.key for m in mem.messages()] != [m.key for m in source.messages]:
            raise ValueError(f"memory {memory_key!r} in {self._backend.describe()}: its messages are not the dataset's")
        return mem

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

    def _public(self, query: Query) -> tuple[MemoryBase, Query]:
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
