"""Time expressions in a question, resolved against ``asked_at`` by a maintained library,
and the ``rules`` window source built on them (docs/design.md, decision 11: time arithmetic is a
library's job; deciding what the question needs is the locator's).

The library is Microsoft Recognizers-Text (``ms-recognizers-text-date-time``, MIT): it
finds "last week", "in March", "two days ago", "since May 3", "the first half of
September 2022" ... and resolves them against a reference time into dates or date ranges
("last week" is the previous Monday-Sunday, "last month" the previous calendar month).
What this module adds is only what the library leaves open:

- **Which year.** A year-less expression ("in June", "on Sunday") comes back as a past
  and a future candidate; a question looks back, so the latest candidate that starts at
  or before ``asked_at`` wins.
- **Open ranges.** "since March" has no end and "before May 3" no start: they are closed
  by ``asked_at`` and by the start of the memory.
- **Nothing the library cannot resolve** (durations, "recently", "the summer", times of
  day alone) is guessed at: it yields no cue.
- **Event time vs mention time.** Messages are indexed by when they were said; a cue that
  lies wholly outside the visible memory (before its first message, or after
  ``asked_at``, e.g. "4 years ago" or "in 2010") says nothing about where the evidence is
  and is dropped (``clip``).
- **Spans anchored to a time.** The library reads "the week before August 3, 2023" as two
  results: "the week" (the *current* week) and "before August 3, 2023" (everything before
  it), and "the day after May 3" as May 3. Both are composed into the span the words name
  (July 27 .. August 2; May 4): a bare period ("the week", "the weekend") is the one next
  to the anchor, a counted one ("two days", "a week") the day that far from it.
- **Spans anchored to an event.** "The week of the merger" or "the month before the reorg"
  is not the current week or month, which is all the library can make of it: no cue.

``TimeCue`` is what the locator prompt shows (``cue 1: "last week" = 2023-05-01 ..
2023-05-07``) and what ``{"cue": 1}`` in a locator answer refers to. The ``rules`` source
turns every cue into a window, widened by ``pad_days``; no cue means ``temporal=false``.
Resolution costs ~20-50 ms a question in pure Python, so results are memoised per
(text, reference time) and a batch of new questions is resolved on every core
(``prepare_cues``).

Which resolutions are kept on disk (``cue_cache_path``, ``resolver_for``): the questions
of a dataset (evaluation, training, the demo: everything that asks through a
``MemoryCollection`` or ``shared_resolver()``) in ``$TIDER_CACHE/cues.jsonl``, default
``.cache/tider/cues.jsonl`` under the working directory, since the same thousands of
questions come back in every run; the questions an application asks of its own memory
(``TemporalMemory``, ``tider memory serve``) in process memory only, a bounded memo, unless
``TIDER_CUE_CACHE`` names a file (the opt-in; then every path keeps its resolutions
there). ``TIDER_CUE_CACHE=off`` keeps nothing on disk anywhere. The file never holds a
question: a row is a SHA-256 of (text, asked_at, floor) and the resolved cues (the time
expressions' own words, "last week", and their dates).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

from tider.locator.expressions import (
    DATED_TYPES,
    Found,
    TimeCue,
    compose,
    end_of_day,
    event_anchored,
    readings,
    start_of_day,
)
from tider.locator.sources import BaseSource, register_source
from tider.types import NON_TEMPORAL, Memory, Query, Window, WindowPrediction

logger = logging.getLogger(__name__)

# Bumped when resolutions change, so cached ones from an older resolver are not reused.
RESOLVER_VERSION = 2


class CueResolver:
    """Resolves the time expressions of a question against its ``asked_at``.

    ``cache_path`` (a JSONL file) keeps resolutions across processes: the library costs
    tens of milliseconds a question, the same questions come back in every training and
    evaluation run, and an appended line per question survives a killed run (a torn last
    line is skipped on load). A line holds the SHA-256 of the question's key, never its
    text (``cue_digest``); lines of an older tider that held the text are rewritten so on
    load. ``memo_size`` bounds the in-process memo (least recently used out first; None:
    unbounded), for a long-running service that meets ever new questions."""

    def __init__(self, culture: str = "en-us", cache_path: str | Path | None = None, memo_size: int | None = None):
        self.culture = culture
        self._model = None
        self._memo: OrderedDict[str, tuple[TimeCue, ...]] = OrderedDict()  # cue_digest(key) -> cues
        self._memo_lock = threading.Lock()
        self.memo_size = memo_size
        self.cache_path = Path(cache_path) if cache_path else None
        if self.cache_path is not None and self.cache_path.exists():
            self._load()

    def _load(self) -> None:
        plaintext = False
        for line in self.cache_path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                if row.get("v") != RESOLVER_VERSION:
                    continue
                if "key" in row:
                    digest = str(row["key"])
                else:  # written before keys were hashed: the question in plaintext
                    digest = cue_digest(
                        (row["text"], datetime.fromisoformat(row["asked_at"]), datetime.fromisoformat(row["floor"]))
                    )
                    plaintext = True
                self._memo[digest] = tuple(
                    TimeCue(c, Window(datetime.fromisoformat(a), datetime.fromisoformat(b))) for c, a, b in row["cues"]
                )
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        if plaintext:
            self._rewrite()

    def _rewrite(self) -> None:
        """The cache file again, hashed rows only (temp file, then rename: a reader sees one or the other)."""
        tmp = self.cache_path.with_name(f".{self.cache_path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(json.dumps(_row(d, cues)) + "\n" for d, cues in self._memo.items()), encoding="utf-8")
        os.replace(tmp, self.cache_path)
        logger.info("%s: question texts replaced by their hashes", self.cache_path)

    def _store(self, digest: str, cues: tuple[TimeCue, ...]) -> None:
        if self.cache_path is None:
            return
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.cache_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(_row(digest, cues)) + "\n")

    def _known(self, digest: str) -> tuple[TimeCue, ...] | None:
        with self._memo_lock:
            cues = self._memo.get(digest)
            if cues is not None and self.memo_size is not None:
                self._memo.move_to_end(digest)
            return cues

    def _remember(self, digest: str, cues: tuple[TimeCue, ...]) -> None:
        with self._memo_lock:
            self._memo[digest] = cues
            if self.memo_size is not None:
                self._memo.move_to_end(digest)
                while len(self._memo) > self.memo_size:
                    self._memo.popitem(last=False)
        self._store(digest, cues)

    def _parse(self, text: str, reference: datetime):
        if self._model is None:  # building the recognizer compiles hundreds of regexes
            from ms_recognizers_date_time import DateTimeRecognizer

            self._model = DateTimeRecognizer(self.culture).get_datetime_model(self.culture)
        return self._model.parse(text, reference)

    def resolve(self, text: str, asked_at: datetime, floor: datetime | None = None) -> tuple[TimeCue, ...]:
        """Cues in the order they occur in ``text``; ``floor`` closes ranges without a
        start ("before May 3"), default four years before ``asked_at``."""
        key = (text, asked_at, floor or asked_at - timedelta(days=4 * 365))
        digest = cue_digest(key)
        cues = self._known(digest)
        if cues is None:
            cues = tuple(self._resolve(*key))
            self._remember(digest, cues)
        return cues

    def resolve_many(self, keys: Iterable[tuple[str, datetime, datetime]], workers: int | None = None) -> int:
        """Resolve the ``(text, asked_at, floor)`` keys not known yet, in ``workers``
        processes (default: one per core, at most 8); returns how many were new. The library
        is single-threaded Python, and a training run meets thousands of new questions at
        once (a fresh checkout resolves the demo's 2,200 in about half the time on 2 cores)."""
        todo = list(dict.fromkeys(k for k in keys if self._known(cue_digest(k)) is None))
        workers = min(workers or os.cpu_count() or 1, 8, max(1, len(todo) // 64))
        if workers <= 1:
            for key in todo:
                self.resolve(*key)
            return len(todo)
        import multiprocessing

        parts = [(self.culture, todo[i::workers]) for i in range(workers)]
        # spawn, not fork: the caller may hold torch's thread pools, which a forked child inherits broken
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for part in pool.imap_unordered(_resolve_part, parts):
                for key, cues in part:
                    self._remember(cue_digest(key), cues)
        return len(todo)

    def _resolve(self, text: str, asked_at: datetime, floor: datetime) -> list[TimeCue]:
        found = [Found.of(r) for r in self._parse(text, asked_at)]
        cues: list[TimeCue] = []
        i = 0
        while i < len(found):
            here, anchor = found[i], found[i + 1] if i + 1 < len(found) else None
            windows = compose(here, anchor, text)
            if windows:
                words, i = f"{here.text} {anchor.text}", i + 2
            else:
                i += 1
                if here.kind not in DATED_TYPES or event_anchored(here, text):
                    continue
                words, windows = here.text, readings(here, floor, asked_at)
            past = [w for w in windows if w.start <= asked_at]
            if not past:
                continue
            cue = TimeCue(words, max(past, key=lambda w: w.start))  # the latest reading not in the future
            if cue not in cues:
                cues.append(cue)
        return cues


def cue_digest(key: tuple[str, datetime, datetime]) -> str:
    """What the cache keeps of a question's ``(text, asked_at, floor)``: its SHA-256."""
    text, asked_at, floor = key
    return hashlib.sha256(json.dumps([text, asked_at.isoformat(), floor.isoformat()]).encode("utf-8")).hexdigest()


def _row(digest: str, cues: tuple[TimeCue, ...]) -> dict:
    return {
        "v": RESOLVER_VERSION,
        "key": digest,
        "cues": [[c.text, c.window.start.isoformat(), c.window.end.isoformat()] for c in cues],
    }


def visible_span(memory: Memory, asked_at: datetime) -> Window | None:
    """``[first message, asked_at]`` as whole days; None when nothing was said by then."""
    if not len(memory) or memory.timestamps[0] > asked_at:
        return None
    return Window(start_of_day(memory.timestamps[0]), end_of_day(asked_at))


def query_cues(resolver: CueResolver, query: Query, memory: Memory) -> tuple[TimeCue, ...]:
    """The question's cues clipped to the part of the memory it can see."""
    span = visible_span(memory, query.asked_at)
    if span is None:
        return ()
    cues = resolver.resolve(*cue_key(query, memory))
    clipped = (c.clip(span.start, span.end) for c in cues)
    return tuple(c for c in clipped if c is not None)


def _resolve_part(job: tuple[str, list]) -> list:
    """A worker of ``CueResolver.resolve_many``: its own recognizer, no cache file."""
    culture, keys = job
    resolver = CueResolver(culture)
    return [(key, resolver.resolve(*key)) for key in keys]


def cue_key(query: Query, memory: Memory) -> tuple[str, datetime, datetime] | None:
    """What ``query_cues`` resolves for ``query``; None when nothing was said by then."""
    span = visible_span(memory, query.asked_at)
    return None if span is None else (query.text, query.asked_at, span.start)


def prepare_cues(resolver: CueResolver, queries: Iterable[Query], memories: dict, workers: int | None = None) -> int:
    """Resolve the time expressions of ``queries`` ahead, on every core (``resolve_many``)."""
    keys = (cue_key(q, memories[q.memory_key]) for q in queries if q.memory_key in memories)
    return resolver.resolve_many([k for k in keys if k is not None], workers)


_SHARED: CueResolver | None = None
_PRIVATE: CueResolver | None = None
_RESOLVERS_LOCK = threading.Lock()
CUE_CACHE_ENV = "TIDER_CUE_CACHE"
_OFF = {"", "0", "off", "none", "false", "no"}
# The memo of the questions asked of applications' memories: a bound, not a log.
PRIVATE_MEMO_SIZE = 4096


def default_cache_path() -> Path | None:
    """Where ``shared_resolver()`` keeps resolutions: ``$TIDER_CUE_CACHE`` (a file; ``off``:
    nowhere), else ``$TIDER_CACHE/cues.jsonl``, else ``.cache/tider/cues.jsonl`` under the cwd."""
    chosen = os.environ.get(CUE_CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in _OFF else Path(chosen)
    root = os.environ.get("TIDER_CACHE")
    return (Path(root) if root else Path(".cache") / "tider") / "cues.jsonl"


def cue_cache_opted_in() -> bool:
    """Whether ``$TIDER_CUE_CACHE`` names a file: then the questions asked of a memory
    (``TemporalMemory``, the service) are kept there too."""
    chosen = os.environ.get(CUE_CACHE_ENV)
    return chosen is not None and chosen.strip().lower() not in _OFF


def shared_resolver() -> CueResolver:
    """One resolver per process for a dataset's questions (the recognizer is expensive to
    build), kept on disk at ``default_cache_path()``."""
    global _SHARED
    with _RESOLVERS_LOCK:
        if _SHARED is None:
            _SHARED = CueResolver(cache_path=default_cache_path())
        return _SHARED


def private_resolver() -> CueResolver:
    """The process's resolver for questions an application asks of its memory: nothing on
    disk, a bounded memo (``PRIVATE_MEMO_SIZE``)."""
    global _PRIVATE
    with _RESOLVERS_LOCK:
        if _PRIVATE is None:
            _PRIVATE = CueResolver(memo_size=PRIVATE_MEMO_SIZE)
        return _PRIVATE


def resolver_for(store) -> CueResolver:
    """The resolver for a question asked through ``store``: a dataset's collection
    (``tider.memory.MemoryCollection``: evaluation, training rewards) gets
    ``shared_resolver()``, anything else (one memory: ``TemporalMemory``, the service)
    ``private_resolver()`` unless ``$TIDER_CUE_CACHE`` opts in."""
    collection = sys.modules.get("tider.memory.collection")  # not imported: not a collection
    if cue_cache_opted_in() or (collection is not None and isinstance(store, collection.MemoryCollection)):
        return shared_resolver()
    return private_resolver()


@register_source("rules")
class RulesWindows(BaseSource):
    """Learning-free baseline: every time expression of the question becomes a window.

    ``pad_days`` widens each window on both sides (LongMemEval's time-aware expansion pads
    +-2 days); the default is a small pad. No resolvable expression -> ``temporal=false`` (semantic path)."""

    name = "rules"

    def __init__(self, pad_days: float = 1.0, resolver: CueResolver | None = None):
        self.pad = timedelta(days=pad_days)
        self.resolver = resolver  # None: the one for each store (``resolver_for``)

    def predict(self, query: Query, store) -> WindowPrediction:
        cues = query_cues(self.resolver or resolver_for(store), query, store.messages(query.memory_key))
        if not cues:
            return NON_TEMPORAL
        windows = sorted({c.window.widen(self.pad) for c in cues})
        return WindowPrediction(temporal=True, windows=tuple(windows))

    def cues(self, queries: Sequence[Query], memories: Sequence[Memory]) -> list[tuple[TimeCue, ...]]:
        resolver = self.resolver or shared_resolver()  # a dataset's memories
        return [query_cues(resolver, q, m) for q, m in zip(queries, memories)]
