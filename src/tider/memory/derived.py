"""The indexes an ``EmbeddedMemory`` derives from its messages and vectors, built on first
use and grown with each add where they can (``tider.memory.embedded`` says which), saved
next to the segments (``tider.memory.files``) so the next process loads them.

``DerivedIndexes`` is the part of ``MemoryState`` that keeps them; it reads the state's
messages, rows and vectors and never changes them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tider.retrieval.bm25 import BM25Index, expand_message
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.dense import CHUNK, FaissRows
from tider.retrieval.postings import Postings
from tider.types import Message


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


class DerivedIndexes:
    """BM25 (postings or a rebuilt ``BM25Index``), faiss rows, the timeline, and when they are saved."""

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
        postings = Postings.load(saved[0]) if saved and saved[1]["messages"] <= self.n_rows else None
        if postings is None or postings.analysis != self.config.lexical():
            postings = Postings(self.config.lexical())
        postings.remove(np.flatnonzero(self.dead[: postings.n_rows]))  # deleted since the save
        by_row = self.memory_by_row()[postings.n_rows :]
        terms = iter(self._terms([m for m in by_row if m is not None]))
        postings.add([None if m is None else next(terms) for m in by_row])
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

    def _kept_postings(self, keep: np.ndarray) -> Postings | None:
        """The postings of rows ``keep``, renumbered in that order (no text analysed again)."""
        if self._postings is None:
            return None
        tokens = [self._postings.tokens[int(r)] for r in keep]
        postings = Postings(self._postings.analysis)
        postings.add(tokens)
        return postings

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
        p, saved = self._postings, self._saved_postings
        grown = p is not None and p.n_rows - saved >= max(4 * CHUNK, saved // 10)
        if p is not None and (p.n_rows > saved or self._postings_unsaved) and (force or grown):
            self.files.save_derived("postings", p.n_rows, p.save)
            self._saved_postings, self._postings_unsaved = p.n_rows, False
        if force and self._timeline is not None and self._timeline_from is None:
            saved = self.files.derived_dir("timeline")
            if not saved or saved[1]["messages"] != len(self.memory):
                self._save_timeline()
