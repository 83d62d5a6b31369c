"""``PostgresMemory``: what ``TemporalMemory("postgresql://...", name=...)`` returns.

The same API and the same query code as the embedded store (``tider.memory.base``: query,
window sources, search, context); what differs is where the memory lives and who ranks.
Each search reads one REPEATABLE READ snapshot, so the window source's view of the memory,
the channels and the returned messages agree even while other processes add; adds are
transactions (``tider.memory.pg.write``). Many processes may open the same memory.

Where results may differ from the embedded store (docs/design.md, "Many processes"):
floats (pgvector sums inner products in its own order, BM25 is computed in double
precision where bm25s stores float32), so near-ties may swap; on the HNSW path, the graph
(pgvector's, not faiss's) and its depth (``PostgresConfig.hnsw_depth``); and, past
``rrf_depth`` messages, which zero-score messages fill the lexical list (the earliest
here, whichever numpy's partition picks there).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

import numpy as np

from tider.memory.base import MemoryBase
from tider.memory.built import REINDEX_HINT, built_with, check_build, check_embedder, stored_config
from tider.memory.files import StoreError
from tider.memory.pg import rank as sql
from tider.memory.pg.config import PostgresConfig
from tider.memory.pg.gaps import NO_GAPS
from tider.memory.pg.pool import acquire, release
from tider.memory.pg.snapshot import Snapshot, Snapshots
from tider.memory.pg.views import MemoryView
from tider.memory.pg.write import Fresh, bm25_terms, commit_add, existing_keys, hnsw_state, index_when_grown, memory_row
from tider.memory.records import MemoryInputError, to_messages, version_of
from tider.memory.store import Ranking
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.retriever import anchors, uses_windows
from tider.types import Memory, Message, Query, WindowPrediction


class PostgresMemory(MemoryBase):
    def __init__(
        self,
        path: str,
        *,
        config: RetrievalConfig | None = None,
        embedder=None,
        name: str | None = None,
        granularity: str = "day",
        locator: Mapping | None = None,
        source_options: Mapping | None = None,
        cache_elements: int = 20_000_000,
        postgres: PostgresConfig | None = None,
    ):
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise MemoryInputError("name", "a database holds many memories: name this one (1 to 200 characters)")
        self.url, self.name, self.pg = path, name, postgres or PostgresConfig()
        self._embedder = embedder  # before the config check: it checks the embedder too
        self.pool = acquire(path, self.pg)
        try:
            with self.pool.connection() as conn:
                stored = conn.execute(
                    "SELECT config, granularity FROM tider_memories WHERE name = %s", (name,)
                ).fetchone()
            self.config = self._settle_config(config, stored[0] if stored else None)
        except BaseException:
            release(self.pool)
            raise
        self._granularity = stored[1] if stored else granularity
        super().__init__(source_options, locator, cache_elements)
        self._snapshots = Snapshots(self.pool, name)
        self._view = MemoryView(name, self._granularity)
        self._released = False
        self._hnsw_ready = False

    def _settle_config(self, config: RetrievalConfig | None, stored: dict | None) -> RetrievalConfig:
        """The memory's config: the one it was built with; a different index setting is refused."""
        if stored is not None:
            built = stored_config(stored)
            where, hint = f"memory {self.name!r} at {self.pool.where}", self.reindex_hint()
            if config is not None:
                # the database scores BM25 itself: which Python engine would have is moot
                check_build(built, replace(config, bm25_backend=built.bm25_backend), self._embedder, where, hint)
            else:
                check_embedder(built, self._embedder, where, hint)
            config = config or built
        config = config or RetrievalConfig()
        if config.bm25_method != "lucene":
            raise StoreError(f"bm25_method={config.bm25_method!r}: the PostgreSQL backend scores BM25 as 'lucene'")
        return config

    def reindex_hint(self) -> str:
        from tider.memory.pg.pool import describe_url

        return REINDEX_HINT.format(where=describe_url(self.url), name=f" --memory {self.name}")

    @property
    def granularity(self) -> str:
        return self._granularity

    @property
    def embedder(self):
        if self._embedder is None:
            from tider.retrieval.embed import shared_embedder

            self._embedder = shared_embedder(self.config.embedding_model, self.config.embedding_cache_dir)
        return self._embedder

    # -- reads: one snapshot per search ---------------------------------------------------
    def _read(self):
        """This thread's snapshot, or a new one for the duration (``tider.memory.pg.snapshot``)."""
        return self._snapshots.read()

    def _side(self, snap: Snapshot, wanted: bool):
        return self._snapshots.side(snap, wanted)

    def _reading(self):
        return self._read()

    def _copy(self, snap: Snapshot):
        row = snap.row
        return self._view.at(snap.conn, row.id if row else None, row.version if row else 0, row.rewritten if row else 0)

    def __len__(self) -> int:
        with self._read() as snap:
            return snap.row.n if snap.row else 0

    def _newest(self) -> datetime | None:
        with self._read() as snap:
            return snap.row.max_ts if snap.row else None

    def messages(self, name: str | None = None) -> Memory:
        self._own(name)
        with self._read() as snap:
            return self._copy(snap).memory

    def timeline(self, name: str | None = None):
        self._own(name)
        with self._read() as snap:
            copy = self._copy(snap)
            return self._view.timeline(
                snap.conn, snap.row.id if snap.row else None, copy, self.embedder, self._gaps(snap)
            )

    def vectors_by_position(self) -> np.ndarray:
        with self._read() as snap:
            if snap.row is None:
                return np.zeros((0, 0), dtype=np.float32)
            return self._view.vectors(snap.conn, snap.row.id, self._copy(snap))

    def dense_scores_at(self, vector: np.ndarray, positions) -> np.ndarray:
        """As ``EmbeddedMemory.dense_scores_at``: own vectors, raised to the best chunk's in SQL."""
        wanted = np.asarray(positions, dtype=np.int64)
        vector = np.ascontiguousarray(vector, dtype=np.float32)
        with self._read() as snap:
            scores = self.vectors_by_position()[wanted] @ vector
            if snap.row is not None and len(wanted):
                stored = np.atleast_1d(self._gaps(snap).stored(wanted))
                rows = snap.conn.execute(
                    "SELECT m.pos, max(-(c.embedding <#> %s)) FROM tider_chunks c JOIN tider_messages m "
                    "ON m.memory_id = c.memory_id AND m.seq = c.seq WHERE c.memory_id = %s AND m.pos = ANY(%s) "
                    "GROUP BY m.pos",
                    (vector, snap.row.id, stored.tolist()),
                ).fetchall()
                for pos, best in rows:
                    here = stored == pos
                    scores[here] = np.maximum(scores[here], np.float32(best))
        return scores

    def _messages_at(self, positions) -> list[Message]:
        with self._read() as snap:
            return sql.messages_at(snap.conn, snap.row, positions, self._gaps(snap)) if len(positions) else []

    def _gaps(self, snap: Snapshot):
        """The snapshot's gaps (stored positions no message holds), read once per version."""
        return self._view.gaps(snap.conn, snap.row) if snap.row else NO_GAPS

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)

    def prepare(self, queries: Iterable[Query | str]) -> None:
        texts = [q if isinstance(q, str) else q.text for q in queries]
        if texts:
            self.embed_queries(list(dict.fromkeys(texts)))

    def context(self, *args, **kwargs):
        with self._read():  # the forest is built from one snapshot
            return super().context(*args, **kwargs)

    # -- ranking ---------------------------------------------------------------------------
    def _asked(self, asked_at: datetime | None) -> datetime:
        return asked_at if self.config.past_only and asked_at is not None else sql.FAR_FUTURE

    def cut(self, asked_at: datetime | None) -> int:
        with self._read() as snap:
            return self._gaps(snap).dense(self._stored_cut(snap, asked_at))

    def _stored_cut(self, snap: Snapshot, asked_at: datetime | None) -> int:
        return sql.cut_at(snap.conn, snap.row, self._asked(asked_at)) if snap.row else 0

    def _use_hnsw(self, snap: Snapshot, exact: bool | None, cut: int) -> bool:
        """The HNSW path: not asked to be exact, a memory of ``hnsw_min_messages`` or more
        with its index built, and a past large enough that a walk of at most 1000 (pgvector's
        limit) finds ``hnsw_depth`` of it; a smaller past is scanned exactly."""
        row = snap.row
        if exact or row.n < self.config.hnsw_min_messages or row.dim is None:
            return False
        if self.pg.hnsw_depth * row.n > 1000 * cut:
            return False
        if not self._hnsw_ready:  # an index, once valid, stays: ask the catalog until then
            self._hnsw_ready = bool(hnsw_state(snap.conn, row.id))
        return self._hnsw_ready

    def _candidates(self, snap: Snapshot, query: Query, query_vector, hnsw: bool, mode: str, cut: int):
        vec_key = None if query_vector is None else np.asarray(query_vector, dtype=np.float32).tobytes()
        key = (query.text, vec_key, self._asked(query.asked_at), mode, hnsw, snap.row.version)
        with self._cache_lock:
            if key in self._semantic:
                self._semantic.move_to_end(key)
                return self._semantic[key]
        vector = None
        if mode in ("dense", "hybrid"):
            vector = (
                np.asarray(query_vector, dtype=np.float32).reshape(-1)
                if query_vector is not None
                else self.embed_queries([query.text])[0]
            )
        asked = self._asked(query.asked_at)
        with self._side(snap, hnsw and mode == "hybrid") as side:
            found = sql.candidates(
                snap.conn,
                snap.row,
                query.text,
                vector,
                mode,
                cut,
                asked,
                hnsw,
                self.config,
                self.pg,
                side=side,
                gaps=self._gaps(snap),
            )
        with self._cache_lock:
            self._semantic[key] = found
            while self._semantic and len(self._semantic) * 2 * self.config.rrf_depth > self.cache_elements:
                self._semantic.popitem(last=False)
        return found

    def rank(
        self,
        query: Query,
        prediction: WindowPrediction,
        k: int,
        query_vector=None,
        exact: bool | None = None,
        semantic: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """``(positions, scores, exact)``: ``exact`` says whether the dense list was exact."""
        from tider.memory.index import semantic_top_k, windowed_rank

        with self._read() as snap:
            cut = self._stored_cut(snap, query.asked_at)
            if cut == 0:
                return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32), True
            gaps = self._gaps(snap)
            hnsw = self._use_hnsw(snap, exact, gaps.dense(cut))
            found = self._candidates(snap, query, query_vector, hnsw, semantic or self.config.semantic, cut)
            if not uses_windows(prediction, self.config):
                ids, scores = semantic_top_k(found, k)
            else:
                inside = sql.window_ranges(snap.conn, snap.row, prediction.windows, cut, gaps)
                padded = any(w.core is not None for w in prediction.windows)
                core = sql.window_ranges(snap.conn, snap.row, anchors(prediction), cut, gaps) if padded else inside
                ids, scores = windowed_rank(found, inside, self.config, k, core)
            return ids, scores, not hnsw

    def ranking(self, query: Query, mode: str | None = None, exact: bool | None = None) -> Ranking:
        """The semantic channel's candidates for ``query`` (positions best first, sim)."""
        with self._read() as snap:
            cut = self._stored_cut(snap, query.asked_at)
            if cut == 0:
                return Ranking(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
            hnsw = self._use_hnsw(snap, exact, self._gaps(snap).dense(cut))
            found = self._candidates(snap, query, None, hnsw, mode or self.config.semantic, cut)
            return Ranking(found.ids, found.sim)

    def build_indexes(self) -> None:
        """Nothing to build: each add wrote its postings, statistics and timeline."""

    # -- adds ------------------------------------------------------------------------------
    def add(
        self, messages: Sequence[Message | Mapping], vectors: np.ndarray | None = None, embed_chunks: bool = False
    ) -> list[str]:
        """Add messages (dicts or ``Message``s); as ``EmbeddedMemory.add``. Committed when
        this returns; a key the memory holds (added by any process) is a no-op."""
        records = to_messages(messages)
        keys = [r.key for r in records]
        if vectors is not None:
            vectors = self._check_vectors(vectors, len(records), None)
        first = {}
        for i, r in enumerate(records):
            first.setdefault(r.key, i)
        if not first:
            return keys
        memory_id = self._ensure_row()
        with self.pool.connection() as conn:
            known = existing_keys(conn, memory_id, list(first))
        picks = [i for k, i in first.items() if k not in known]
        if not picks:
            return keys
        fresh_msgs = [records[i] for i in picks]
        if vectors is None:
            vecs, chunks = self._embedded(fresh_msgs)
        else:
            vecs, chunks = vectors[picks], self._chunks(fresh_msgs, vectors.shape[1]) if embed_chunks else (None, None)
        fresh = Fresh(fresh_msgs, vecs, bm25_terms(fresh_msgs, self.config), *chunks)
        embedding = built_with(self.config, int(vecs.shape[1]), self.embedder)
        with self.pool.connection() as conn:
            commit_add(conn, memory_id, fresh, self.config, embedding)
            index_when_grown(conn, memory_id, vecs.shape[1], self.config.hnsw_min_messages, self.pg)
        return keys

    # -- record management (the public calls are MemoryBase's) ------------------------------
    def get(self, key: str) -> Message | None:
        """Message ``key`` (its ``id`` its position now), or None: one row, not the memory."""
        from tider.memory.pg.manage import read_message

        memory_id = self._memory_id()
        if memory_id is None:
            return None
        with self.pool.connection() as conn:
            return read_message(conn, memory_id, key)

    def _memory_id(self) -> int | None:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT id FROM tider_memories WHERE name = %s", (self.name,)).fetchone()
        return None if row is None else int(row[0])

    def _delete(self, keys: Sequence[str] | None, start: datetime | None, end: datetime | None) -> list[str]:
        """One transaction (``tider.memory.pg.manage``): the rows, their postings and chunks
        are deleted, statistics, positions and timeline follow. The text leaves the disk
        after PostgreSQL vacuums the dead rows (autovacuum, or ``VACUUM``; ``VACUUM FULL``
        to rewrite the files: ``tider.memory.pg.manage``)."""
        from tider.memory.pg.manage import commit_delete

        memory_id = self._memory_id()
        if memory_id is None or (keys is not None and not keys):
            return []
        with self.pool.connection() as conn:
            gone = commit_delete(conn, memory_id, keys, start, end, self.config)
        if gone:
            self._forget_scores()
        return gone

    def _replace(self, old: Message, new: Message) -> Message | None:
        """``new`` in ``old``'s row, one transaction, if the stored message is still ``old``
        (else None: the caller reads again); a new embedding text is embedded first,
        outside the row lock."""
        from tider.memory.pg.manage import commit_replace
        from tider.retrieval.embed import embedding_text

        memory_id = self._memory_id()
        if memory_id is None:
            from tider.memory.records import MessageNotFound

            raise MessageNotFound(self.name, new.key)
        template = self.config.embed_template
        terms = bm25_terms([new], self.config)[0]
        embedded = None if embedding_text(old, template) == embedding_text(new, template) else self._embed_one(new)
        expected = version_of(old)
        with self.pool.connection() as conn:
            out = commit_replace(
                conn, self.name, memory_id, new, terms, embedded, lambda now: version_of(now) == expected, self.config
            )
        if out is not None:
            self._forget_scores()
        return out

    def _embed_one(self, message: Message) -> tuple[np.ndarray, np.ndarray]:
        """``message``'s vector and its chunks' vectors, as an add embeds them."""
        vecs, (chunks, _) = self._embedded([message])
        return vecs[0], chunks

    def _forget_scores(self) -> None:
        with self._cache_lock:  # keyed by version too; this only frees the memory sooner
            self._semantic.clear()

    def _embedded(self, messages: Sequence[Message]) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """The vectors of ``messages`` and their chunks' (vectors, owner index)."""
        from tider.retrieval.embed import embedding_text

        texts = [embedding_text(m, self.config.embed_template) for m in messages]
        vecs = self._check_vectors(np.asarray(self.embedder.encode(texts), dtype=np.float32), len(messages), None)
        return vecs, self._chunks(messages, vecs.shape[1])

    def _chunks(self, messages: Sequence[Message], dim: int) -> tuple[np.ndarray, np.ndarray]:
        from tider.retrieval.embed import embed_chunks

        cfg = self.config
        return embed_chunks(self.embedder, messages, cfg.embed_template, cfg.embed_chunking, dim)

    def _ensure_row(self) -> int:
        """The memory's id, creating its row (with this config) on its first add."""
        with self.pool.connection() as conn:
            memory_id, stored = memory_row(conn, self.name, self._granularity, json.dumps(self.config.to_json()))
        self._settle_config(self.config, stored)  # another process may have created it differently
        return memory_id

    def close(self) -> None:
        if not self._released:
            self._released = True
            release(self.pool)

    def __del__(self):
        if getattr(self, "_released", True) is False:
            with contextlib.suppress(Exception):
                self.close()
