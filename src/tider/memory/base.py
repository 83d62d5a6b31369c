"""``MemoryBase``: what every memory backend shares: its options, the query a window
source sees, the sources, search, the forest context. ``tider.memory.embedded`` (files in
a directory, or in-process) and ``tider.memory.pg`` (PostgreSQL) implement the rest: where
messages live and how a query is ranked. ``TemporalMemory(...)``
(``tider.memory.temporal_memory``) opens the one its path names.

A backend implements, besides ``tider.memory.store.MemoryStore``'s reads (``messages``,
``timeline``, ``ranking``, ``prepare``): ``add``, ``close``, ``__len__``, ``granularity``,
``rank`` (positions and scores for a prediction), ``cut`` (how much a query asked at a
time may see), ``build_indexes``, the window sources' reads (``embed_queries``,
``vectors_by_position``, ``dense_scores_at``) and the three hooks ``search`` runs on
(``_reading``: one consistent view; ``_newest``; ``_messages_at``), and the two writes
behind record management (``_delete``, ``_replace``).

Record management is what a mem0 user calls: ``get``, ``get_all`` (paged, by time range),
``update`` (text and/or time), ``delete`` (keys) and ``delete_all`` (a time range, or
everything). Every index follows a change; when a deleted text leaves the disk is the
backend's to say (the embedded store rewrites its files before returning).
"""

from __future__ import annotations

import abc
import bisect
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from tider.memory.files import StoreError
from tider.memory.filters import parse_filter
from tider.memory.records import (
    MemoryInputError,
    MessageNotFound,
    VersionConflict,
    checked_text,
    message_to_json,
    to_message,
    to_utc,
    version_of,
)
from tider.memory.store import Ranking
from tider.types import NON_TEMPORAL, Memory, Message, Query, WindowPrediction

if TYPE_CHECKING:
    from typing_extensions import Self

    from tider.retrieval.config import RetrievalConfig


@dataclass
class SearchHits:
    """Best first: the messages' keys (what ``add`` took and returns), scores, the messages,
    their time-order positions (``Message.id``)."""

    keys: list[str]
    scores: list[float]
    messages: list[Message]
    positions: list[int]
    prediction: WindowPrediction
    exact: bool = True

    def __len__(self) -> int:
        return len(self.keys)


class MemoryBase(abc.ABC):
    """One named memory. ``source_options`` configures the named window sources
    (``{"locator": {"url": ...}}``); ``cache_elements`` bounds the per-query cache of
    window-independent scores (0 turns it off)."""

    config: RetrievalConfig
    name: str

    def __init__(self, source_options: Mapping | None, locator: Mapping | None, cache_elements: int):
        self.source_options = {**dict(source_options or {}), **({"locator": dict(locator)} if locator else {})}
        self._sources: dict[str, Any] = {}
        self._semantic: OrderedDict = OrderedDict()
        self.cache_elements = cache_elements
        self._cache_lock = threading.Lock()

    def names(self) -> list[str]:
        return [self.name]

    def _own(self, name: str | None) -> None:
        if name is not None and name != self.name:
            raise KeyError(f"this store holds memory {self.name!r}, not {name!r}")

    @staticmethod
    def _check_vectors(vectors, n: int, dim: int | None) -> np.ndarray:
        arr = np.asarray(vectors, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[0] != n:
            raise MemoryInputError("vectors", f"expected shape ({n}, dim), got {arr.shape}")
        if dim is not None and arr.shape[1] != dim:
            raise MemoryInputError("vectors", f"dimension {arr.shape[1]}, the store holds {dim}")
        if not np.isfinite(arr).all():
            raise MemoryInputError("vectors", "not finite")
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
        if (norms == 0).any():
            raise MemoryInputError("vectors", "a zero vector has no direction")
        return arr / norms  # cosine similarity: unit rows

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what a backend implements ----------------------------------------------------------
    @abc.abstractmethod
    def __len__(self) -> int: ...

    @property
    @abc.abstractmethod
    def granularity(self) -> str: ...

    @abc.abstractmethod
    def messages(self, name: str | None = None) -> Memory: ...

    @abc.abstractmethod
    def timeline(self, name: str | None = None): ...

    @abc.abstractmethod
    def add(
        self, messages: Sequence[Message | Mapping], vectors: np.ndarray | None = None, embed_chunks: bool = False
    ) -> list[str]: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def build_indexes(self) -> None: ...

    @abc.abstractmethod
    def rank(
        self,
        query: Query,
        prediction: WindowPrediction,
        k: int,
        query_vector=None,
        exact: bool | None = None,
        semantic: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray, bool]: ...

    @abc.abstractmethod
    def ranking(self, query: Query, mode: str | None = None, exact: bool | None = None) -> Ranking: ...

    @abc.abstractmethod
    def cut(self, asked_at: datetime | None) -> int: ...

    @abc.abstractmethod
    def prepare(self, queries: Iterable[Query | str]) -> None: ...

    @abc.abstractmethod
    def embed_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    @abc.abstractmethod
    def vectors_by_position(self) -> np.ndarray: ...

    @abc.abstractmethod
    def dense_scores_at(self, vector: np.ndarray, positions) -> np.ndarray: ...

    @abc.abstractmethod
    def _delete(self, keys: Sequence[str] | None, start: datetime | None, end: datetime | None) -> list[str]:
        """Delete, atomically, the messages ``keys`` (None: those in ``[start, end]``, either
        end open) and return the keys deleted, in time order."""

    @abc.abstractmethod
    def _replace(self, old: Message, new: Message) -> Message | None:
        """Put ``new`` (same key) in ``old``'s place, atomically, every index updated; the
        stored message (its position now as ``id``). None, writing nothing, when the stored
        message is no longer ``old`` (``version_of`` differs); gone: MessageNotFound."""

    @abc.abstractmethod
    def _reading(self): ...

    @abc.abstractmethod
    def _newest(self) -> datetime | None: ...

    @abc.abstractmethod
    def _messages_at(self, positions) -> list[Message]: ...

    # -- managing records ----------------------------------------------------------------
    def get(self, key: str) -> Message | None:
        """Message ``key`` (its ``id`` its position now), or None."""
        with self._reading():
            memory = self.messages()
            pos = memory.id_of(key)
            return None if pos is None else memory[pos]

    def get_all(self, start=None, end=None, offset: int = 0, limit: int = 100, filters=None) -> list[Message]:
        """The messages with ``start <= timestamp <= end`` (either end open) that ``filters``
        (``tider.memory.filters``) keep, in time order: ``limit`` of them from the ``offset``-th."""
        lo, hi = _time_range(start, end)
        keep = parse_filter(filters)
        if not isinstance(offset, int) or offset < 0:
            raise MemoryInputError("offset", f"expected an integer >= 0, got {offset!r}")
        if not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise MemoryInputError("limit", f"expected an integer in [1, {MAX_PAGE}], got {limit!r}")
        with self._reading():
            memory = self.messages()
            first, stop = positions_between(memory.timestamps, lo, hi)
            if keep is None:
                return memory.slice(first + offset, min(stop, first + offset + limit))
            return [m for m in memory.slice(first, stop) if keep.matches(m)][offset : offset + limit]

    def update(
        self, key: str, text: str | None = None, timestamp=None, if_version: str | None = None, metadata=None
    ) -> Message:
        """Replace message ``key``'s text, time and/or metadata (a mapping that replaces the
        old one), its other fields kept; returns it as stored. The embedding is recomputed for
        a new text (outside any write lock).
        ``if_version`` (``version_of`` the message as read) makes it conditional: a message
        changed since is a ``VersionConflict``, never a lost update. Without it, a change
        that lands between this call's read and its write is read again and built upon."""
        if text is None and timestamp is None and metadata is None:
            raise MemoryInputError("update", "give a text, a timestamp, metadata or any of them")
        for _ in range(UPDATE_TRIES):
            old = self.get(key)
            if old is None:
                raise MessageNotFound(self.name, key)
            if if_version is not None and version_of(old) != if_version:
                raise VersionConflict(self.name, key, version_of(old))
            changed = {**message_to_json(old), **({"text": text} if text is not None else {})}
            if timestamp is not None:
                changed["timestamp"] = to_utc(timestamp, "timestamp")
            if metadata is not None:
                changed["metadata"] = metadata
            new = replace(to_message(changed, "update"), id=old.id)
            stored = old if new == old else self._replace(old, new)
            if stored is not None:
                if stored.text != old.text:
                    self._forget_vectors([old])
                return stored
        raise StoreError(f"memory {self.name!r}: message {key!r} kept changing during the update; retry it")

    def delete(self, keys: str | Sequence[str]) -> list[str]:
        """Delete message ``keys`` (one or many); returns those that were there."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not all(isinstance(k, str) for k in keys):
            raise MemoryInputError("keys", "expected message keys (strings)")
        keys = list(dict.fromkeys(keys))
        doomed = [m for k in keys if (m := self.get(k)) is not None]
        gone = self._delete(keys, None, None) if keys else []
        self._forget_vectors([m for m in doomed if m.key in set(gone)])
        return gone

    def delete_all(self, start=None, end=None, filters=None) -> list[str]:
        """Delete the messages with ``start <= timestamp <= end`` (no bounds: every one) that
        ``filters`` keep; returns their keys, in time order."""
        lo, hi = _time_range(start, end)
        keep = parse_filter(filters)
        with self._reading():
            memory = self.messages()
            first, stop = positions_between(memory.timestamps, lo, hi)
            doomed = [m for m in memory.slice(first, stop) if keep is None or keep.matches(m)]
        gone = self._delete(None, lo, hi) if keep is None else self._delete([m.key for m in doomed], None, None)
        self._forget_vectors([m for m in doomed if m.key in set(gone)])
        return gone

    def _forget_vectors(self, messages: Sequence[Message]) -> None:
        """Deleted or rewritten texts leave the embedder's caches, in memory and on disk
        (their own vector and their long-text chunks'), so a deleted text's vector is not
        kept. Embedders without a cache (``forget``) keep nothing to forget."""
        forget = getattr(self.embedder, "forget", None)
        if forget is None or not messages:
            return
        from tider.retrieval.embed import embedding_text, message_chunks

        cfg = self.config
        texts = [embedding_text(m, cfg.embed_template) for m in messages]
        chunks = message_chunks(self.embedder, messages, cfg.embed_template, cfg.embed_chunking)
        forget(texts + [t for pieces in chunks for t in pieces])

    # -- search -------------------------------------------------------------------------
    def query(self, text: str, asked_at=None, user: str | None = None) -> Query:
        """The ``Query`` a window source sees (no gold: nothing on this path has any)."""
        if not isinstance(text, str):
            raise MemoryInputError("text", f"expected a string, got {type(text).__name__}")
        text = checked_text(text, "text")
        user = checked_text(user, "user") if user is not None else None
        self._keep_private(text)
        when = to_utc(asked_at, "asked_at") if asked_at is not None else None
        if when is None:
            when = self._newest() or datetime(1970, 1, 1)
        digest = hashlib.sha1(repr((text, when.isoformat(), user)).encode()).hexdigest()[:12]
        return Query(key=f"{self.name}:{digest}", memory_key=self.name, text=text, asked_at=when, user=user)

    def _keep_private(self, text: str) -> None:
        """The question's vector stays off disk unless ``$TIDER_CUE_CACHE`` opts in to keeping
        questions there (tider.locator.rules.cue_cache_opted_in)."""
        from tider.locator.rules import cue_cache_opted_in

        keep = getattr(self.embedder, "keep_private", None)
        if keep is not None and not cue_cache_opted_in():
            keep([text])

    def predict(self, query: Query, windows="none") -> WindowPrediction:
        """The window source's prediction: ``windows`` is a registered name, a source
        object (``predict(query, store)``) or a ``WindowPrediction``."""
        if isinstance(windows, WindowPrediction):
            return windows
        if windows is None or windows == "none":
            return NON_TEMPORAL
        source = self.source(windows) if isinstance(windows, str) else windows
        if not hasattr(source, "predict"):
            raise MemoryInputError(
                "windows", f"expected a source name, a WindowSource or a WindowPrediction, got {windows!r}"
            )
        return source.predict(query, self)

    def source(self, name: str):
        """The registered window source ``name``, built once with this memory's options."""
        from tider.locator.sources import make_source_from_context

        if name not in self._sources:
            context = {"store": self, "source_options": self.source_options}
            try:
                self._sources[name] = make_source_from_context(name, context)
            except (TypeError, ValueError) as err:  # unknown name, missing options (locator URL, oracle gold)
                raise MemoryInputError("windows", f"source {name!r} cannot be built here: {err}") from None
        return self._sources[name]

    def search(
        self,
        text: str,
        asked_at=None,
        user: str | None = None,
        k: int | None = None,
        windows="none",
        query_vector: np.ndarray | None = None,
        exact: bool | None = None,
        semantic: str | None = None,
        filters=None,
    ) -> SearchHits:
        """The top-``k`` messages for ``text`` asked at ``asked_at`` (nothing after it with
        ``config.past_only``), ranked by the dual-channel retriever with the windows of
        ``windows``. ``exact``: True scores every message, False takes the index-backed
        path, None (default) chooses by size (``config.index_min_messages``). ``semantic``
        overrides the channel mode (dense | bm25 | hybrid). ``filters``
        (``tider.memory.filters``): only the messages they keep, in the order the exact
        ranking of every visible message gives them."""
        k = self.config.k if k is None else int(k)
        if k < 1:
            raise MemoryInputError("k", f"must be at least 1, got {k}")
        keep = parse_filter(filters)
        with self._reading():
            query = self.query(text, asked_at, user)
            prediction = self.predict(query, windows)
            depth = k if keep is None else max(k, self.cut(query.asked_at))
            exact = exact if keep is None else True
            positions, scores, used_exact = self.rank(query, prediction, depth, query_vector, exact, semantic)
            if keep is not None:  # match on the memory's own copy; read only the k kept
                memory = self.messages()
                kept = [i for i, p in enumerate(positions) if keep.matches(memory[int(p)])][:k]
                positions, scores = [positions[i] for i in kept], [scores[i] for i in kept]
            msgs = self._messages_at(positions)
        return SearchHits(
            [m.key for m in msgs], [float(s) for s in scores], msgs, [int(i) for i in positions], prediction, used_exact
        )

    def retrieve(
        self, query: Query, prediction: WindowPrediction, k: int | None = None, mode: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Dual-channel ``(positions, scores)``, best first, for an already-made prediction."""
        ids, scores, _ = self.rank(query, prediction, self.config.k if k is None else k, semantic=mode)
        return ids, scores

    # -- the forest back end --------------------------------------------------------------
    def context(
        self,
        text: str,
        asked_at=None,
        user: str | None = None,
        k: int | None = None,
        windows="none",
        llm=None,
        budget: int | None = None,
        top_n: int | None = None,
        classifier: str | None = None,
    ):
        """Evidence for a reader (T-Mem): search seeds, evidence selection in the windows
        (with ``llm``), UPDATE/EXPAND/ROOT structuring, IDF span compression to ``budget``
        tokens, linearization. See ``tider.memory.context``. ``k`` defaults to this store's
        retrieval config, ``budget`` and ``top_n`` to ``tider.memory.context``'s (which
        ``tider eval qa`` uses too)."""
        from tider.memory.context import BUDGET, TOP_N, build_context

        budget = BUDGET if budget is None else budget
        top_n = TOP_N if top_n is None else top_n
        return build_context(self, text, asked_at, user, k, windows, llm, budget, top_n, classifier)


MAX_PAGE = 10_000  # get_all's largest page
UPDATE_TRIES = 5  # an unconditional update re-reads a message changed under it this often


def _time_range(start, end) -> tuple[datetime | None, datetime | None]:
    lo = None if start is None else to_utc(start, "start")
    hi = None if end is None else to_utc(end, "end")
    if lo is not None and hi is not None and hi < lo:
        raise MemoryInputError("end", f"{hi.isoformat()} is before start {lo.isoformat()}")
    return lo, hi


def positions_between(timestamps: Sequence[datetime], lo: datetime | None, hi: datetime | None) -> tuple[int, int]:
    """The positions ``[first, stop)`` whose time is in ``[lo, hi]``."""
    first = 0 if lo is None else bisect.bisect_left(timestamps, lo)
    return first, len(timestamps) if hi is None else bisect.bisect_right(timestamps, hi)
