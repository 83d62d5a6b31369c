"""``EmbeddedMemory``: a memory in one process, in files under a directory (or in RAM),
what ``TemporalMemory(path)`` opens for a directory or ``None``.

```python
from tider import TemporalMemory
mem = TemporalMemory("stores/team-chat")          # creates the directory or opens the store
mem.add([{"key": "m1", "text": "...", "timestamp": "2024-02-01T10:00:00", "speaker": "ana"}])
hits = mem.search("what did we decide at the offsite?", asked_at="2024-03-01T09:00:00", k=20)
hits.keys, hits.scores, hits.messages, hits.prediction
```

Ids. A message has three names: its ``key`` (given, or generated from its content), its
*row* (the order it was added in: its line in the segment files and its faiss id, never
renumbered) and its *position* in time order (``Message.id`` in ``messages()``, which is
what windows, BM25 and the timeline work on: a window is a contiguous position range).
``row_of_pos`` maps one to the other. Messages added in time order (the usual case) get
position == row and everything only appends; a message older than the newest one moves
the positions after it, so the time-ordered views are rebuilt and the timeline re-merges
from the cluster before it. Equal timestamps keep the order of addition, which is why two
adds give exactly the same memory, and the same results, as one add of the same messages.
A delete or an update marks rows dead instead of moving any (``tider.memory.tombstones``).

Search. ``exact=True``, or a memory under ``config.index_min_messages``, scores every
message as ``tider.retrieval`` always has (bit for bit); otherwise the index-backed path
(``tider.memory.index``) fuses faiss and BM25 candidate lists. With ``config.past_only``
(default) a query ranks only the messages at or before its ``asked_at``; BM25 term
statistics are those of the whole store, as in any search engine with a filter.

Indexes grow with an add where they can: BM25's postings (``tider.retrieval.postings``;
scores are made at query time from today's statistics), faiss by appending rows
(``tider.retrieval.dense``), the timeline by continuing its merge. The time-ordered vector
copy and the exact-scoring caches are rebuilt when a search first needs them. An add
embeds before it takes the write lock, so searches wait only for the append.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from tider.memory import index as indexed
from tider.memory.base import MemoryBase, positions_between
from tider.memory.records import MessageNotFound, to_messages, version_of
from tider.memory.state import MemoryState
from tider.memory.store import Ranking
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.retriever import dual_channel_rank, exact_similarity
from tider.types import Memory, Message, Query, WindowPrediction


@dataclass
class _Semantic:
    """A query's window-independent part, cached: exact (sim, order) or index candidates."""

    exact: bool
    sim: np.ndarray | None = None
    order: np.ndarray | None = None
    candidates: indexed.Candidates | None = None


class ReadWriteLock:
    """Many readers or one writer (writers wait for readers to leave, new readers for writers)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    @contextlib.contextmanager
    def reading(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._writing)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def writing(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._writing)
            self._writing = True
            self._cond.wait_for(lambda: self._readers == 0)
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class EmbeddedMemory(MemoryBase):
    """One memory: persistent when ``path`` is given, in-process otherwise (``path=None``).

    ``locator``: how ``windows="locator"`` reaches the trained model, e.g.
    ``{"url": "http://127.0.0.1:8000/v1"}`` or ``{"model": "exports/tiny-locator"}``; its
    prompt settings come from the export's metadata. ``source_options`` configures other
    named sources the same way (``{"prompted": {...}}``). ``cache_elements`` bounds the
    per-query cache of window-independent scores (the harness asks one query at several
    k and the rewards with many windows); 0 turns it off.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        config: RetrievalConfig | None = None,
        embedder=None,
        name: str | None = None,
        granularity: str = "day",
        locator: Mapping | None = None,
        source_options: Mapping | None = None,
        cache_elements: int = 20_000_000,
    ):
        self.state = MemoryState(path, config=config, embedder=embedder, name=name, granularity=granularity)
        self.config = self.state.config
        self.name = self.state.name
        super().__init__(source_options, locator, cache_elements)
        self._lock = ReadWriteLock()  # adds are serialized and exclusive; searches run together

    # -- the memory (``tider.memory.store.MemoryStore``: a store of one memory) ----------
    def __len__(self) -> int:
        return len(self.state.memory)

    @property
    def granularity(self) -> str:
        return self.state.memory.granularity

    def messages(self, name: str | None = None) -> Memory:
        """The messages in time order (``Message.id`` is the position)."""
        self._own(name)
        return self.state.memory

    def timeline(self, name: str | None = None):
        """The event clusters (built on first use after an add, saved with the store)."""
        self._own(name)
        return self.state.timeline()

    def add(
        self, messages: Sequence[Message | Mapping], vectors: np.ndarray | None = None, embed_chunks: bool = False
    ) -> list[str]:
        """Add messages (dicts or ``Message``s); ``vectors`` (n x dim float32, one row per
        input message) skips the embedder, and with them a long message gets no chunk
        vectors unless ``embed_chunks`` (the vectors are this memory's embedder's, as in a
        reindex). Returns every input message's key; a key the memory already holds is a
        no-op. Persistent stores have committed the messages when this returns."""
        records = to_messages(messages)
        if vectors is not None:
            vectors = self._check_vectors(vectors, len(records), self.state.dim)
        with self._lock.reading():
            picks = self.state.fresh(records)
        if picks:
            todo = [records[i] for i in picks]
            # embedding, the slow part, runs outside the lock: searches go on meanwhile
            embedded = self.state.embed(todo, None if vectors is None else vectors[picks], embed_chunks)
            with self._lock.writing():  # an add racing this one may have taken some keys: add re-checks
                self.state.add(todo, *embedded)
                self._forget_scores()
        return [r.key for r in records]

    def _delete(self, keys, start, end) -> list[str]:
        with self._lock.writing():
            memory = self.state.memory
            if keys is None:
                first, stop = positions_between(memory.timestamps, start, end)
                gone = [m.key for m in memory.slice(first, stop)]
            else:
                found = {memory.id_of(key) for key in keys} - {None}
                gone = [memory[p].key for p in sorted(found)]  # in time order
            if gone:
                self.state.delete_rows([self._row_of(key) for key in gone])
                self._forget_scores()
        return gone

    def _replace(self, old: Message, new: Message) -> Message | None:
        from tider.retrieval.embed import embedding_text

        template = self.config.embed_template
        embedded = None if embedding_text(new, template) == embedding_text(old, template) else self.state.embed_one(new)
        with self._lock.writing():  # the embedding above ran outside it
            row = self._row_of(new.key)
            if version_of(self.state.memory[self.state.memory.id_of(new.key)]) != version_of(old):
                return None  # changed since it was read: the caller reads again
            if embedded is None:  # the same embedding text: the stored vectors stay
                owned = self.state.chunk_rows == row
                chunks = self.state.chunks.rows.reshape(-1, self.state.dim)[owned]
                embedded = self.state.vectors.rows[row], (chunks, np.zeros(len(chunks), dtype=np.int64))
            self.state.replace_row(row, new, *embedded)
            self._forget_scores()
            return self.state.memory[self.state.memory.id_of(new.key)]

    def _row_of(self, key: str) -> int:
        pos = self.state.memory.id_of(key)
        if pos is None:
            raise MessageNotFound(self.name, key)
        return int(self.state.row_of_pos[pos])

    def _forget_scores(self) -> None:
        with self._cache_lock:
            self._semantic.clear()

    def build_indexes(self) -> None:
        """Build now what the first search would (BM25 over every message; the dense rows
        and the timeline grow with the adds or are built on their first use)."""
        with self._lock.reading():
            self.state.bm25()

    def close(self) -> None:
        with self._lock.writing():
            self.state.close()

    # -- what the shared query code asks of a backend ----------------------------------------
    def _reading(self):
        """Held while a search runs: adds wait (here); a database backend reads one snapshot."""
        return self._lock.reading()

    def _newest(self) -> datetime | None:
        """The latest message time (a query without ``asked_at`` is asked then)."""
        return self.state.memory.timestamps[-1] if len(self) else None

    def _messages_at(self, positions) -> list[Message]:
        return [self.state.memory[int(i)] for i in positions]

    @property
    def embedder(self):
        return self.state.embedder

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.state.embed_queries(texts)

    def vectors_by_position(self) -> np.ndarray:
        """Every message's vector, rows in time order."""
        return self.state.vectors_by_position()

    def dense_scores_at(self, vector: np.ndarray, positions) -> np.ndarray:
        """The dense score of the messages at ``positions``: a long message's best chunk's."""
        return self.state.dense_scores(np.asarray(vector, dtype=np.float32))[np.asarray(positions, dtype=np.int64)]

    def cut(self, asked_at: datetime | None) -> int:
        """Number of positions a query asked at ``asked_at`` may see."""
        if not self.config.past_only or asked_at is None:
            return len(self)
        return bisect.bisect_right(self.state.memory.timestamps, asked_at)

    def rank(
        self,
        query: Query,
        prediction: WindowPrediction,
        k: int,
        query_vector=None,
        exact: bool | None = None,
        semantic: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """``(positions, scores, exact)`` for an already-made prediction (the harness and
        the rewards call this with their own predictions)."""
        state = self.state
        cut = self.cut(query.asked_at)
        if cut == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32), True
        if exact is None:
            exact = len(self) < self.config.index_min_messages
        part = self.semantic_part(query, query_vector, exact, semantic or self.config.semantic, cut)
        if part.exact:
            ids, scores = dual_channel_rank(part.sim, state.ts_days()[:cut], prediction, self.config, k, part.order)
        else:
            ids, scores = indexed.indexed_rank(part.candidates, state.ts_days(), prediction, self.config, k)
        return ids, scores, part.exact

    def semantic_part(self, query: Query, query_vector, exact: bool, mode: str, cut: int) -> _Semantic:
        vec_key = None if query_vector is None else np.asarray(query_vector, dtype=np.float32).tobytes()
        key = (query.text, vec_key, cut, mode, exact, self.state.generation)
        with self._cache_lock:
            if key in self._semantic:
                self._semantic.move_to_end(key)
                return self._semantic[key]
        state = self.state
        vector = None
        if mode in ("dense", "hybrid"):
            vector = (
                np.asarray(query_vector, dtype=np.float32).reshape(-1)
                if query_vector is not None
                else state.embed_queries([query.text])[0]
            )
        bm25 = state.bm25().scores(query.text) if mode in ("bm25", "hybrid") else None
        if exact:
            dense = state.dense_scores(vector) if vector is not None else None
            sim = exact_similarity(
                None if dense is None else dense[:cut], None if bm25 is None else bm25[:cut], self.config, mode
            )
            part = _Semantic(True, sim=sim, order=np.lexsort((np.arange(sim.shape[0]), -sim)))
        else:
            pos, scores = state.dense_search(vector, cut) if vector is not None else (None, None)
            part = _Semantic(
                False,
                candidates=indexed.fuse(pos, scores, None if bm25 is None else bm25[:cut], mode, self.config, cut),
            )
        with self._cache_lock:
            self._semantic[key] = part
            while self._semantic and len(self._semantic) * max(len(self), 1) > self.cache_elements:
                self._semantic.popitem(last=False)
        return part

    def ranking(self, query: Query, mode: str | None = None, exact: bool | None = None) -> Ranking:
        """The semantic channel for ``query`` over what it may see: every visible position
        best first (exact scoring), or the index-backed path's candidates."""
        cut = self.cut(query.asked_at)
        if cut == 0:
            return Ranking(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
        if exact is None:
            exact = len(self) < self.config.index_min_messages
        part = self.semantic_part(query, None, exact, mode or self.config.semantic, cut)
        if part.exact:
            return Ranking(part.order, part.sim[part.order])
        return Ranking(part.candidates.ids, part.candidates.sim)

    def prepare(self, queries: Iterable[Query | str]) -> None:
        """Embed query texts in one batch (fills the embedding cache)."""
        texts = [q if isinstance(q, str) else q.text for q in queries]
        self.state.embed_queries(list(dict.fromkeys(texts)))
