"""What an ``EmbeddedMemory`` holds: messages, vectors, the row/position maps, and (through
``tider.memory.derived``) the indexes derived from them.

See ``tider.memory.embedded`` for the id scheme and ``tider.memory.files`` for the
layout and the crash-safety argument. Everything here assumes the caller serializes adds.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from tider.memory.built import REINDEX_HINT, built_with, check_build, check_embedder, stored_config
from tider.memory.derived import DerivedIndexes
from tider.memory.files import StoreError, StoreFiles
from tider.memory.records import message_from_json, message_to_json
from tider.memory.tombstones import DEAD, Tombstones
from tider.retrieval.channels import to_days
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.postings import Postings
from tider.types import Memory, Message

MERGE_SEGMENTS_OVER = 32  # more segment files than this: merge them into one


def no_chunks(dim: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((0, dim), dtype=np.float32), np.zeros(0, dtype=np.int64)


class VectorBuffer:
    """Rows of float32 vectors with amortised appends (capacity doubles)."""

    def __init__(self):
        self._buf: np.ndarray | None = None
        self.n = 0

    def append(self, rows: np.ndarray) -> None:
        if self._buf is None:
            self._buf = np.empty((max(len(rows), 1024), rows.shape[1]), dtype=np.float32)
        if self.n + len(rows) > len(self._buf):
            grown = np.empty((max(2 * len(self._buf), self.n + len(rows)), self._buf.shape[1]), dtype=np.float32)
            grown[: self.n] = self._buf[: self.n]
            self._buf = grown
        self._buf[self.n : self.n + len(rows)] = rows
        self.n += len(rows)

    @property
    def rows(self) -> np.ndarray:
        return self._buf[: self.n] if self._buf is not None else np.zeros((0, 0), dtype=np.float32)


class MemoryState(DerivedIndexes, Tombstones):
    def __init__(self, path, config: RetrievalConfig | None, embedder, name: str | None, granularity: str):
        self.files = StoreFiles(path) if path is not None else None
        manifest = self.files.read_manifest() if self.files else None
        if manifest is not None:
            stored = stored_config(manifest["config"])
            hint = REINDEX_HINT.format(where=Path(path).parent, name=f" --memory {manifest['name']}")
            if config is not None:
                check_build(stored, config, embedder, str(path), hint)
            else:
                check_embedder(stored, embedder, str(path), hint)
            config, name, granularity = config or stored, manifest["name"], manifest["granularity"]
        self.config = config or RetrievalConfig()
        self.name = name or (Path(path).name if path is not None else "memory")
        if embedder is None:
            from tider.retrieval.embed import shared_embedder

            embedder = shared_embedder(self.config.embedding_model, self.config.embedding_cache_dir)
        self.embedder = embedder
        self._empty_views(granularity)
        self.dim: int | None = None
        self.generation = 0
        self.manifest = manifest or {
            "name": self.name,
            "granularity": granularity,
            "segments": [],
            "next_segment": 1,
            "config": self.config.to_json(),
            "embedding": {},
        }
        self._build = threading.Lock()  # lazily built indexes: one builder at a time
        if manifest is not None:
            self._load()

    def _empty_views(self, granularity: str) -> None:
        self.memory = Memory(self.name, [], granularity)  # time order, Message.id = position
        self.row_of_pos = np.zeros(0, dtype=np.int64)
        self.seq = np.zeros(0, dtype=np.int64)  # per row: its place among equal times (its row, or the updated one's)
        self.dead = np.zeros(0, dtype=bool)  # per row: deleted, or replaced by an update (tider.memory.tombstones)
        self.vectors = VectorBuffer()
        # the extra chunks of long messages (tider.retrieval.embed), in row order, and the
        # row each belongs to
        self.chunks = VectorBuffer()
        self.chunk_rows = np.zeros(0, dtype=np.int64)
        self._bm25 = self._ts = self._by_pos = self._faiss = self._timeline = self._pos_of_row = None
        self._postings: Postings | None = None  # by row; grows with each add (``bm25``)
        self._saved_postings = 0  # rows the saved postings cover
        self._postings_unsaved = False  # a change dropped the saved copy: save at the next flush
        self._in_order = True  # row == position for every message
        self._timeline_from: int | None = None  # first position the timeline has not merged yet
        self._saved_graph_rows = 0

    # -- loading and adding -------------------------------------------------------------
    def _load(self) -> None:
        self.files.remove_unlisted({s["name"] for s in self.manifest["segments"]})
        self.files.remove_stale_derived()
        dead = set(self.manifest.get("dead", []))
        by_row: list[Message | None] = []
        seqs: list[int] = []
        for seg in self.manifest["segments"]:
            lines, vecs = self.files.read_segment(seg["name"])
            self._append_chunks(*self.files.read_chunks(seg["name"], vecs.shape[1]), first_row=len(by_row))
            for line in lines:
                row = len(by_row)
                alive = row not in dead and line != DEAD
                by_row.append(message_from_json(line, row) if alive else None)
                seqs.append(int(line.get("seq", row)))
            self.vectors.append(vecs)
        self.dim = self.manifest["embedding"].get("dim")
        self._grow_rows(seqs)
        self.dead[[r for r, m in enumerate(by_row) if m is None]] = True
        self._in_order = not self.dead.any()
        self._place([m for m in by_row if m is not None], first_row=0)
        entry = self.files.derived_dir("faiss")
        self._saved_graph_rows = int(entry[1].get("graph_rows", 0)) if entry else 0
        entry = self.files.derived_dir("postings")
        self._saved_postings = int(entry[1]["messages"]) if entry else 0
        if dead:  # a change committed, its lines perhaps not yet scrubbed (a crash in between)
            self._scrub(sorted(dead), recovering=True)

    def fresh(self, records: Sequence[Message]) -> list[int]:
        """Indices of the ``records`` whose key this memory does not hold (first of a repeat)."""
        seen, picks = set(), []
        for i, r in enumerate(records):
            if self.memory.id_of(r.key) is None and r.key not in seen:
                seen.add(r.key)
                picks.append(i)
        return picks

    def embed(
        self, records: Sequence[Message], vectors: np.ndarray | None = None, embed_chunks: bool = False
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """What ``add`` stores for ``records``: their vectors (``vectors`` given: those)
        and their chunks' (vectors, record index); the chunks of given vectors are embedded
        only with ``embed_chunks`` (the vectors are this store's embedder's: a reindex).
        Reads no state: callers run it outside the write lock."""
        vecs = vectors if vectors is not None else self._embed(records)
        dim = vecs.shape[1]
        chunks = self._embed_chunks(records, dim) if vectors is None or embed_chunks else no_chunks(dim)
        return vecs, chunks

    def add(self, records: Sequence[Message], vectors: np.ndarray, chunks: tuple[np.ndarray, np.ndarray]) -> None:
        """Add the new ones of ``records`` with what ``embed`` made for them."""
        picks = self.fresh(records)
        if not picks:
            return
        fresh, vecs = [records[i] for i in picks], vectors[picks]
        if self.dim is not None and vecs.shape[1] != self.dim:
            raise StoreError(
                f"memory {self.name!r}: the embedder gives dimension {vecs.shape[1]}, the store holds {self.dim}"
            )
        owned = np.isin(chunks[1], picks)
        chunks = (chunks[0][owned], np.searchsorted(picks, chunks[1][owned]))
        first_row = self.n_rows
        fresh = [replace(m, id=first_row + i) for i, m in enumerate(fresh)]
        if self.files is not None:
            self._commit(fresh, vecs, chunks)
        self.dim = vecs.shape[1]
        self.vectors.append(vecs)
        self._append_chunks(*chunks, first_row=first_row)
        self._grow_rows(np.arange(first_row, first_row + len(fresh)))
        self._place(fresh, first_row)
        if self._postings is not None:
            self._postings.add(self._terms(fresh))
        self.flush()

    def _embed(self, messages: Sequence[Message]) -> np.ndarray:
        from tider.retrieval.embed import embedding_text

        return np.asarray(
            self.embedder.encode([embedding_text(m, self.config.embed_template) for m in messages]), dtype=np.float32
        )

    def _embed_chunks(self, messages: Sequence[Message], dim: int) -> tuple[np.ndarray, np.ndarray]:
        from tider.retrieval.embed import embed_chunks

        cfg = self.config
        return embed_chunks(self.embedder, messages, cfg.embed_template, cfg.embed_chunking, dim)

    def _append_chunks(self, vectors: np.ndarray, rows: np.ndarray, first_row: int) -> None:
        if len(rows):
            self.chunks.append(np.asarray(vectors, dtype=np.float32))
            self.chunk_rows = np.concatenate([self.chunk_rows, first_row + np.asarray(rows, dtype=np.int64)])

    def _commit(self, fresh: list[Message], vecs: np.ndarray, chunks: tuple[np.ndarray, np.ndarray]) -> None:
        m = self.manifest
        name = f"seg-{m['next_segment']:06d}"
        self.files.write_segment(name, [message_to_json(x) for x in fresh], vecs, chunks)
        embedding = built_with(self.config, int(vecs.shape[1]), self.embedder)
        self.manifest = {
            **m,
            "segments": m["segments"] + [{"name": name, "messages": len(fresh)}],
            "next_segment": m["next_segment"] + 1,
            "messages": len(self.memory) + len(fresh),
            "embedding": embedding,
        }
        self.files.commit(self.manifest)
        if len(self.manifest["segments"]) > MERGE_SEGMENTS_OVER:
            self._merge_segments(vecs, chunks)

    def _merge_segments(self, newest: np.ndarray, newest_chunks: tuple[np.ndarray, np.ndarray]) -> None:
        """Rewrite every segment as one (rows in order), commit, drop the old files."""
        lines = []
        for seg in self.manifest["segments"]:
            lines += self.files.read_segment(seg["name"])[0]
        vectors = np.concatenate([self.vectors.rows, newest])
        chunk_vectors = np.concatenate([self.chunks.rows.reshape(-1, newest.shape[1]), newest_chunks[0]])
        chunk_rows = np.concatenate([self.chunk_rows, self.n_rows + newest_chunks[1]])
        self._write_as_one_segment(lines, vectors, (chunk_vectors, chunk_rows), rows_kept=True)

    def _write_as_one_segment(self, lines: list[dict], vectors, chunks, rows_kept: bool) -> None:
        """Commit ``lines`` (rows in order) as the store's only segment and drop the old files.
        Unless ``rows_kept``, the derived indexes (keyed by row count) go first: a crash then
        leaves the old memory without its caches, never the new one with stale ones."""
        m = self.manifest
        name = f"seg-{m['next_segment']:06d}"
        if lines:
            self.files.write_segment(name, lines, vectors, chunks)
        if not rows_kept:
            self.files.drop_derived()
        segments = [{"name": name, "messages": len(lines)}] if lines else []
        self.manifest = {**m, "segments": segments, "next_segment": m["next_segment"] + 1}
        if not rows_kept:  # a compaction: every row written is alive
            self.manifest.update(messages=len(lines), dead=[])
        self.files.commit(self.manifest)
        self.files.remove_unlisted({s["name"] for s in segments})

    def memory_by_row(self) -> list[Message]:
        """The live messages by row (``id`` their position; a dead row None)."""
        by_row: list = [None] * self.n_rows
        for p, m in enumerate(self.memory.messages):
            by_row[int(self.row_of_pos[p])] = m
        return by_row

    def embed_one(self, message: Message) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """``message``'s vector and its chunks' (vectors, rows 0), as an add would embed them."""
        vector = self._embed([message])[0]
        return vector, self._embed_chunks([message], vector.shape[0])

    def _place(self, fresh: list[Message], first_row: int) -> None:
        """Put rows ``first_row ..`` (``fresh``, ids = rows, their ``seq`` set) into the
        time-ordered views: by time, then ``seq`` (the order of addition)."""
        old_n = len(self.memory)
        fresh_seq = self.seq[[m.id for m in fresh]].tolist()  # the sort key's second part
        ordered = [fresh[i] for i in sorted(range(len(fresh)), key=lambda i: (fresh[i].timestamp, fresh_seq[i]))]
        last = (self.memory.timestamps[-1], int(self.seq[self.row_of_pos[-1]])) if old_n else None
        if last is None or not ordered or (ordered[0].timestamp, int(self.seq[ordered[0].id])) > last:
            rows = np.array([m.id for m in ordered], dtype=np.int64)
            self.memory.append([replace(m, id=i) for i, m in enumerate(ordered)])  # ids keep this order
            self.row_of_pos = np.concatenate([self.row_of_pos, rows])
            first_changed = old_n
        else:
            by_row = self.memory_by_row()
            for m in fresh:
                by_row[m.id] = m
            live, seq = [r for r, m in enumerate(by_row) if m is not None], self.seq.tolist()
            order = sorted(live, key=lambda r: (by_row[r].timestamp, seq[r]))
            messages = [replace(by_row[r], id=i) for i, r in enumerate(order)]
            self.memory = Memory(self.name, messages, self.memory.granularity)
            new_rows = np.array([m.id for m in fresh], dtype=np.int64)
            self.row_of_pos = np.array(order, dtype=np.int64)
            first_changed = int(np.flatnonzero(np.isin(self.row_of_pos, new_rows))[0])
        self._in_order = (
            self._in_order
            and first_changed == old_n
            and bool(np.array_equal(self.row_of_pos[old_n:], np.arange(old_n, len(self.row_of_pos))))
        )
        self.generation += 1
        self._bm25 = self._by_pos = None
        self._ts = self._ts if first_changed == old_n else None
        if self._timeline is not None or self._timeline_from is not None:
            self._timeline_from = (
                first_changed if self._timeline_from is None else min(self._timeline_from, first_changed)
            )
        self._pos_of_row = None

    # -- derived, lazily ------------------------------------------------------------------
    def ts_days(self) -> np.ndarray:
        ts = self._ts
        if ts is None or len(ts) != len(self.memory):
            start = 0 if ts is None else len(ts)
            tail = np.array([to_days(t) for t in self.memory.timestamps[start:]], dtype=np.float64)
            ts = tail if ts is None else np.concatenate([ts, tail])
            self._ts = ts
        return ts

    def vectors_by_position(self) -> np.ndarray:
        if self._in_order:
            return self.vectors.rows
        if self._by_pos is None:
            self._by_pos = np.ascontiguousarray(self.vectors.rows[self.row_of_pos])
        return self._by_pos

    def positions_of_rows(self) -> np.ndarray:
        """The time-order position of every row (-1: a dead row)."""
        if self._pos_of_row is None or len(self._pos_of_row) != self.n_rows:
            self._pos_of_row = np.full(self.n_rows, -1, dtype=np.int64)
            self._pos_of_row[self.row_of_pos] = np.arange(len(self.row_of_pos))
        return self._pos_of_row

    def dense_scores(self, vector: np.ndarray) -> np.ndarray:
        """Every message's dense score by position (exact scoring): the cosine of its own
        vector, or of its best chunk where that is higher."""
        scores = self.vectors_by_position() @ vector
        if self.chunks.n:
            pos = self.positions_of_rows()[self.chunk_rows]
            live = pos >= 0
            np.maximum.at(scores, pos[live], (self.chunks.rows @ vector)[live])
        return scores

    def chunk_search(self, vector: np.ndarray, cut: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """``(positions, best chunk cosine)`` of the ``depth`` past messages whose best chunk
        scores highest. Chunks are scanned exactly (they are the long messages' extra
        vectors, a minority of the rows; no graph over them yet)."""
        if not self.chunks.n:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        pos = self.positions_of_rows()[self.chunk_rows]
        past = (pos >= 0) & (pos < cut)
        best = np.full(cut, -np.inf, dtype=np.float32)
        np.maximum.at(best, pos[past], (self.chunks.rows @ vector)[past])  # the floats dense_scores has
        owners = np.flatnonzero(np.isfinite(best))
        top = owners[np.lexsort((owners, -best[owners]))][:depth]
        return top, best[top]

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)
        if self.dim is not None and vectors.shape[1] != self.dim:
            where = self.files.root if self.files else self.name
            raise StoreError(
                f"{where}: the embedder gives dimension {vectors.shape[1]}, the store's vectors have {self.dim}; "
                + REINDEX_HINT.format(where=Path(where).parent, name=f" --memory {self.name}")
            )
        return vectors

    def dense_search(self, vector: np.ndarray, cut: int) -> tuple[np.ndarray, np.ndarray]:
        """faiss top-``index_depth`` among positions ``< cut``, as ``(positions, scores)``."""
        index, n = self.faiss(), len(self.memory)
        if cut >= n and n == self.n_rows:
            past = None
        elif self._in_order:
            past = cut
        else:  # rows out of time order, or dead ones: a mask of the live past rows
            past = np.zeros(self.n_rows, dtype=bool)
            past[self.row_of_pos[:cut]] = True
        rows, scores = index.search(vector, self.config.index_depth, past, self.config.hnsw_ef_search)
        pos = rows if self._in_order else self.positions_of_rows()[rows]
        if not self.chunks.n:
            return pos, scores
        from tider.memory.index import best_per_message

        chunk_pos, chunk_scores = self.chunk_search(vector, min(cut, n), self.config.index_depth)
        return best_per_message(np.concatenate([pos, chunk_pos]), np.concatenate([scores, chunk_scores]))

    def close(self) -> None:
        if self.files is not None:
            self.flush(force=True)
            self.files.close()
