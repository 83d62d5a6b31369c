"""What an ``EmbeddedMemory`` holds: messages, vectors, the row/position maps, and the
indexes derived from them (built lazily, persisted next to the segments).

See ``tider.memory.embedded`` for the id scheme and ``tider.memory.files`` for the
layout and the crash-safety argument. Everything here assumes the caller serializes adds.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from tider.memory.files import StoreError, StoreFiles
from tider.memory.records import message_from_json, message_to_json
from tider.retrieval.bm25 import BM25Index, expand_message
from tider.retrieval.channels import to_days
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.dense import CHUNK, FaissRows
from tider.retrieval.postings import Postings
from tider.types import Memory, Message

# Config fields an index is built with: a store refuses to open with other values.
BUILD_FIELDS = (
    "embedding_model",
    "embed_template",
    "embed_chunking",
    "bm25_backend",
    "bm25_method",
    "lexical_language",
    "lexical_stemmer",
    "metadata_fields",
    "timeline",
    "hnsw_m",
    "hnsw_min_messages",
)
MERGE_SEGMENTS_OVER = 32  # more segment files than this: merge them into one
# Timeline settings an older tider recorded in a store's manifest and this code no longer has.
# None changed what a store holds or returns (summary_words sized summaries nothing read), so
# they are dropped on opening, whatever their value.
REMOVED_TIMELINE_SETTINGS = ("summary_words",)
# Build settings added since stores recorded their config, with the value every store built
# before them has: its BM25 terms are plain words (no stems) and a long message has one vector
# (its first window), whatever today's defaults are.
ADDED_BUILD_SETTINGS = {"lexical_language": "english", "lexical_stemmer": "none", "embed_chunking": "none"}
REINDEX_HINT = "re-index it with `tider memory reindex --store {where}{name}` (keeps every message)"


def stored_config(config: dict) -> RetrievalConfig:
    """The ``RetrievalConfig`` a manifest records, less ``REMOVED_TIMELINE_SETTINGS``, plus
    ``ADDED_BUILD_SETTINGS`` where it predates them."""
    if isinstance(config.get("timeline"), dict):
        timeline = {k: v for k, v in config["timeline"].items() if k not in REMOVED_TIMELINE_SETTINGS}
        config = {**config, "timeline": timeline}
    return RetrievalConfig.from_json({**ADDED_BUILD_SETTINGS, **config})


def check_build(stored: RetrievalConfig, config: RetrievalConfig, embedder, where: str, hint: str) -> None:
    """Refuse to open a store built with other index settings, or with another embedder,
    than ``config`` / ``embedder`` ask for, saying how to re-index (``hint``)."""
    for f in BUILD_FIELDS:
        if getattr(config, f) != getattr(stored, f):
            raise StoreError(
                f"{where}: built with {f}={getattr(stored, f)!r}, opened with {getattr(config, f)!r}; {hint}"
            )
    check_embedder(stored, embedder, where, hint)


def check_embedder(stored: RetrievalConfig, embedder, where: str, hint: str) -> None:
    """An embedder object whose model is not the store's would search other vectors."""
    from tider.retrieval.embed import embedding_model_id

    given = getattr(embedder, "model_id", None)  # embedders of other makes name no model: trusted
    if given is not None and given != embedding_model_id(stored.embedding_model):
        raise StoreError(
            f"{where}: built with the embedder {embedding_model_id(stored.embedding_model)!r}, "
            f"opened with {given!r}; {hint}"
        )


def built_with(config: RetrievalConfig, dim: int, embedder=None) -> dict:
    """What a store records of how its vectors and terms were made (both backends); the
    chunking names the embedder's window (``tider.retrieval.embed.chunking_id``)."""
    from tider.retrieval.embed import chunking_id, embedding_model_id

    return {
        "model": embedding_model_id(config.embedding_model),
        "dim": dim,
        "template": config.embed_template,
        "chunking": chunking_id(embedder, config.embed_chunking),
        "lexical": config.lexical().id,
    }


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


def lucene(config: RetrievalConfig) -> bool:
    """BM25 as bm25s's default scores it: what ``Postings`` (and PostgreSQL) compute."""
    return config.bm25_backend == "bm25s" and config.bm25_method == "lucene"


class LexicalScores:
    """``Postings`` (by row) scoring by position (``row_of_pos``; None: rows in time order)."""

    def __init__(self, postings: Postings, row_of_pos: np.ndarray | None):
        self.postings, self.row_of_pos = postings, row_of_pos

    def scores(self, query: str) -> np.ndarray:
        by_row = self.postings.scores(query)
        return by_row if self.row_of_pos is None else by_row[self.row_of_pos]


class MemoryState:
    def __init__(self, path, config: RetrievalConfig | None, embedder, name: str | None, granularity: str):
        self.files = StoreFiles(path) if path is not None else None
        manifest = self.files.read_manifest() if self.files else None
        if manifest is not None:
            stored = stored_config(manifest["config"])
            hint = REINDEX_HINT.format(where=Path(path).parent, name=f" --memory {Path(path).name}")
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
        self.vectors = VectorBuffer()
        # the extra chunks of long messages (tider.retrieval.embed), in row order, and the
        # row each belongs to
        self.chunks = VectorBuffer()
        self.chunk_rows = np.zeros(0, dtype=np.int64)
        self._bm25 = self._ts = self._by_pos = self._faiss = self._timeline = self._pos_of_row = None
        self._postings: Postings | None = None  # by row; grows with each add (``bm25``)
        self._saved_postings = 0  # rows the saved postings cover
        self._in_order = True  # row == position for every message
        self._timeline_from: int | None = None  # first position the timeline has not merged yet
        self._saved_graph_rows = 0

    # -- loading and adding -------------------------------------------------------------
    def _load(self) -> None:
        self.files.remove_unlisted({s["name"] for s in self.manifest["segments"]})
        self.files.remove_stale_derived()
        messages: list[Message] = []
        for seg in self.manifest["segments"]:
            lines, vecs = self.files.read_segment(seg["name"])
            self._append_chunks(*self.files.read_chunks(seg["name"], vecs.shape[1]), first_row=len(messages))
            messages += [message_from_json(line, len(messages) + i) for i, line in enumerate(lines)]
            self.vectors.append(vecs)
        self.dim = self.manifest["embedding"].get("dim")
        self._place(messages, first_row=0)
        entry = self.files.derived_dir("faiss")
        self._saved_graph_rows = int(entry[1].get("graph_rows", 0)) if entry else 0
        entry = self.files.derived_dir("postings")
        self._saved_postings = int(entry[1]["messages"]) if entry else 0

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
        first_row = len(self.memory)
        fresh = [replace(m, id=first_row + i) for i, m in enumerate(fresh)]
        if self.files is not None:
            self._commit(fresh, vecs, chunks)
        self.dim = vecs.shape[1]
        self.vectors.append(vecs)
        self._append_chunks(*chunks, first_row=first_row)
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
        chunk_rows = np.concatenate([self.chunk_rows, len(self.memory) + newest_chunks[1]])
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
        self.manifest = {**m, "segments": segments, "next_segment": m["next_segment"] + 1, "messages": len(lines)}
        self.files.commit(self.manifest)
        self.files.remove_unlisted({s["name"] for s in segments})

    # -- deletes and replacements: the store rewritten ---------------------------------------
    def rewrite(self, drop: set[str], new: tuple[Message, np.ndarray, tuple] | None = None) -> None:
        """Remove the messages keyed ``drop`` and put ``new`` (a message, its vector, its
        chunks' vectors and rows) in the row of the message with its key. The files are
        rewritten as one segment, so a removed text has left the disk when this returns;
        the derived indexes are rebuilt on their next use. O(memory): deletes are rare."""
        by_row = self.memory_by_row()
        keep = np.array([r for r, m in enumerate(by_row) if m.key not in drop], dtype=np.int64)
        dim = self.dim or 0
        vectors = self.vectors.rows[keep] if len(keep) else np.zeros((0, dim), dtype=np.float32)
        messages = [replace(by_row[r], id=i) for i, r in enumerate(keep)]
        chunk_vectors = self.chunks.rows.reshape(-1, dim)
        owned = np.isin(self.chunk_rows, keep)
        chunk_vectors, chunk_rows = chunk_vectors[owned], np.searchsorted(keep, self.chunk_rows[owned])
        if new is not None:
            message, vector, (new_chunks, _) = new
            row = next(i for i, m in enumerate(messages) if m.key == message.key)
            messages[row], vectors[row] = replace(message, id=row), vector
            chunk_vectors = np.concatenate([chunk_vectors[chunk_rows != row], new_chunks])
            chunk_rows = np.concatenate([chunk_rows[chunk_rows != row], np.full(len(new_chunks), row)])
            order = np.argsort(chunk_rows, kind="stable")
            chunk_vectors, chunk_rows = chunk_vectors[order], chunk_rows[order]
        postings = self._kept_postings(keep, None if new is None else messages[row])
        if self.files is not None:
            lines = [message_to_json(m) for m in messages]
            self._write_as_one_segment(lines, vectors, (chunk_vectors, chunk_rows), rows_kept=False)
        self._empty_views(self.memory.granularity)
        self.vectors.append(vectors)
        self._append_chunks(chunk_vectors, chunk_rows, first_row=0)
        self._place(messages, first_row=0)
        self._postings = postings

    def _kept_postings(self, keep: np.ndarray, new: Message | None) -> Postings | None:
        """The postings of rows ``keep`` renumbered, ``new`` in its key's row: only the new
        text is analysed again."""
        if self._postings is None:
            return None
        tokens = [self._postings.tokens[int(r)] for r in keep]
        if new is not None:
            tokens[new.id] = self._terms([new])[0]
        postings = Postings(self._postings.analysis)
        postings.add(tokens)
        return postings

    def memory_by_row(self) -> list[Message]:
        """The messages in the order they were added (``id`` their position)."""
        by_row: list = [None] * len(self.memory)
        for p, m in enumerate(self.memory.messages):
            by_row[int(self.row_of_pos[p])] = m
        return by_row

    def embed_one(self, message: Message) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """``message``'s vector and its chunks' (vectors, rows 0), as an add would embed them."""
        vector = self._embed([message])[0]
        return vector, self._embed_chunks([message], vector.shape[0])

    def _place(self, fresh: list[Message], first_row: int) -> None:
        """Put rows ``first_row ..`` (``fresh``, ids = rows) into the time-ordered views."""
        old_n = len(self.memory)
        if not old_n or fresh and min(m.timestamp for m in fresh) >= self.memory.timestamps[-1]:
            order = sorted(range(len(fresh)), key=lambda i: (fresh[i].timestamp, fresh[i].id))
            self.memory.append(fresh)
            self.row_of_pos = np.concatenate([self.row_of_pos, np.array([fresh[i].id for i in order], dtype=np.int64)])
            first_changed = old_n
        else:
            by_row = self.memory_by_row() + list(fresh)
            order = sorted(range(len(by_row)), key=lambda r: (by_row[r].timestamp, r))
            self.memory = Memory(self.name, [replace(by_row[r], id=r) for r in order], self.memory.granularity)
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
        """The time-order position of every row."""
        n = len(self.memory)
        if self._pos_of_row is None or len(self._pos_of_row) != n:
            self._pos_of_row = np.empty(n, dtype=np.int64)
            self._pos_of_row[self.row_of_pos] = np.arange(n)
        return self._pos_of_row

    def dense_scores(self, vector: np.ndarray) -> np.ndarray:
        """Every message's dense score by position (exact scoring): the cosine of its own
        vector, or of its best chunk where that is higher."""
        scores = self.vectors_by_position() @ vector
        if self.chunks.n:
            np.maximum.at(scores, self.positions_of_rows()[self.chunk_rows], self.chunks.rows @ vector)
        return scores

    def chunk_search(self, vector: np.ndarray, cut: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """``(positions, best chunk cosine)`` of the ``depth`` past messages whose best chunk
        scores highest. Chunks are scanned exactly (they are the long messages' extra
        vectors, a minority of the rows; no graph over them yet)."""
        if not self.chunks.n:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        pos = self.positions_of_rows()[self.chunk_rows]
        past = pos < cut
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
                + REINDEX_HINT.format(where=Path(where).parent, name=f" --memory {Path(where).name}")
            )
        return vectors

    def bm25(self) -> LexicalScores:
        """The lexical index, scoring by position. bm25s's ``lucene`` (the default, as the
        PostgreSQL backend scores) is ``Postings`` that grow with each add; another method,
        or the ``rank_bm25`` reference, is a ``BM25Index`` rebuilt after an add."""
        with self._build:
            if self._postings is None and self._bm25 is None:
                if lucene(self.config):
                    self._postings = self._load_postings()
                else:
                    cfg = self.config
                    self._bm25 = BM25Index.from_messages(
                        self.memory.messages, cfg.metadata_fields, cfg.bm25_backend, cfg.bm25_method, cfg.lexical()
                    )
            if self._bm25 is not None:
                return self._bm25
            return LexicalScores(self._postings, None if self._in_order else self.row_of_pos)

    def _terms(self, messages: Sequence[Message]) -> list[list[str]]:
        analysis, fields = self.config.lexical(), self.config.metadata_fields
        return [analysis.terms(expand_message(m, fields)) for m in messages]

    def _load_postings(self) -> Postings:
        """The saved postings plus the rows added since they were saved, or all rows analysed."""
        saved = self.files.derived_dir("postings") if self.files else None
        postings = Postings.load(saved[0]) if saved and saved[1]["messages"] <= len(self.memory) else None
        if postings is None or postings.analysis != self.config.lexical():
            postings = Postings(self.config.lexical())
        by_row = self.memory_by_row()
        postings.add(self._terms(by_row[postings.n_rows :]))
        return postings

    def faiss(self) -> FaissRows:
        cfg = self.config
        with self._build:
            if self._faiss is None:
                saved = self.files.derived_dir("faiss") if self.files else None
                self._faiss = FaissRows.load(
                    saved[0] if saved else None,
                    saved[1] if saved else None,
                    self.dim,
                    cfg.hnsw_min_messages,
                    cfg.hnsw_m,
                    self.vectors.rows,
                )
            elif self._faiss.n < self.vectors.n:
                self._faiss.add(self.vectors.rows)
            return self._faiss

    def dense_search(self, vector: np.ndarray, cut: int) -> tuple[np.ndarray, np.ndarray]:
        """faiss top-``index_depth`` among positions ``< cut``, as ``(positions, scores)``."""
        index, n = self.faiss(), len(self.memory)
        if cut >= n:
            past = None
        elif self._in_order:
            past = cut
        else:
            past = np.zeros(n, dtype=bool)
            past[self.row_of_pos[:cut]] = True
        rows, scores = index.search(vector, self.config.index_depth, past, self.config.hnsw_ef_search)
        pos = rows if self._in_order else self.positions_of_rows()[rows]
        if not self.chunks.n:
            return pos, scores
        from tider.memory.index import best_per_message

        chunk_pos, chunk_scores = self.chunk_search(vector, min(cut, n), self.config.index_depth)
        return best_per_message(np.concatenate([pos, chunk_pos]), np.concatenate([scores, chunk_scores]))

    def timeline(self):
        from tider.retrieval.timeline import Timeline, build_timeline

        cfg = self.config
        with self._build:
            n = len(self.memory)
            if self._timeline is None:
                saved = self.files.derived_dir("timeline") if self.files else None
                if saved and saved[1]["messages"] == n:
                    from safetensors.numpy import load_file

                    arrays = load_file(str(saved[0] / "timeline.safetensors"))
                    self._timeline = Timeline(
                        self.memory,
                        arrays["starts"].tolist(),
                        arrays["vectors"],
                        self.vectors_by_position(),
                        self.embedder,
                    )
                else:
                    self._timeline = build_timeline(
                        self.memory, self.embedder, cfg.timeline, embeddings=self.vectors_by_position()
                    )
                    self._save_timeline()
                self._timeline_from = None
            elif self._timeline_from is not None:
                self._timeline = self._timeline.extend(
                    self.memory, self.vectors_by_position(), cfg.timeline, self._timeline_from
                )
                self._timeline_from = None
            return self._timeline

    def _save_timeline(self) -> None:
        from safetensors.numpy import save_file

        if self.files is None or self._timeline is None:
            return
        t = self._timeline
        arrays = {"starts": np.array(t.starts, dtype=np.int64), "vectors": np.ascontiguousarray(t.vectors)}
        self.files.save_derived(
            "timeline",
            len(self.memory),
            lambda d: (d.mkdir(parents=True, exist_ok=True), save_file(arrays, str(d / "timeline.safetensors"))),
        )

    def flush(self, force: bool = False) -> None:
        """Persist the derived indexes that are worth it (all of them with ``force``)."""
        if self.files is None:
            return
        if (
            self._faiss is not None
            and self._faiss.graph_rows > self._saved_graph_rows
            and (
                force or self._faiss.graph_rows - self._saved_graph_rows >= max(4 * CHUNK, self._saved_graph_rows // 10)
            )
        ):
            self.files.save_derived(
                "faiss", self._faiss.graph_rows, self._faiss.save, extra={"graph_rows": self._faiss.graph_rows}
            )
            self._saved_graph_rows = self._faiss.graph_rows
        p = self._postings
        if p is not None and p.n_rows > self._saved_postings:
            if force or p.n_rows - self._saved_postings >= max(4 * CHUNK, self._saved_postings // 10):
                self.files.save_derived("postings", p.n_rows, p.save)
                self._saved_postings = p.n_rows
        if force and self._timeline is not None and self._timeline_from is None:
            saved = self.files.derived_dir("timeline")
            if not saved or saved[1]["messages"] != len(self.memory):
                self._save_timeline()

    def close(self) -> None:
        if self.files is not None:
            self.flush(force=True)
            self.files.close()
