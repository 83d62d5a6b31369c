"""The data model every tider stage shares.

Decisions (see docs/design.md):
- Timestamps are timezone-naive UTC ``datetime``.
- A ``Window`` is a closed interval ``[start, end]``.
- A ``Memory`` stores its messages sorted by time, and a message's ``id`` is its position
  in that order, so a time window maps to a contiguous id range found by bisection.
- Gold labels (answer, evidence, gold windows, gold temporal flag) live in ``Query.gold``,
  a separate object that the inference path (retrievers, window sources, prompts) never
  reads. ``Query.public()`` returns the query without it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

Granularity = Literal["day", "minute"]
GRANULARITY_UNIT: dict[str, timedelta] = {"day": timedelta(days=1), "minute": timedelta(minutes=1)}


def floor_time(ts: datetime, granularity: Granularity) -> datetime:
    """Round ``ts`` down to the dataset's granularity (day or minute)."""
    if granularity == "day":
        return ts.replace(hour=0, minute=0, second=0, microsecond=0)
    return ts.replace(second=0, microsecond=0)


def format_time(ts: datetime, granularity: Granularity) -> str:
    """ISO 8601 at the dataset's granularity: ``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM``."""
    return ts.strftime("%Y-%m-%d" if granularity == "day" else "%Y-%m-%dT%H:%M")


@dataclass(frozen=True, order=True)
class Window:
    """A closed time interval ``[start, end]``.

    ``core``: for a window widened around what was asked (``rules``' padded cue), the
    unpadded window, its *anchor*: inside the window the temporal channel ranks the pad's
    messages below the core's where similarity does not separate them
    (``tider.retrieval.retriever``). Not part of equality or order: a window is its span."""

    start: datetime
    end: datetime
    core: Window | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.start > self.end:
            raise ValueError(f"window start {self.start} is after end {self.end}")
        if self.core is not None and not (self.start <= self.core.start and self.core.end <= self.end):
            raise ValueError(f"window core {self.core.start} .. {self.core.end} is not inside the window")

    @property
    def anchor(self) -> Window:
        """The part of the window that was asked for: its core, or the whole window."""
        return self.core or self

    def contains(self, ts: datetime) -> bool:
        return self.start <= ts <= self.end

    def widen(self, by: timedelta) -> Window:
        """The window ``by`` wider on each side; what it was widened from stays its core."""
        return Window(self.start - by, self.end + by, self.anchor)

    def clip_end(self, end: datetime) -> Window:
        """The window cut at ``end`` (which must not precede its start), its core cut alike."""
        core = self.core
        if core is not None:
            core = None if core.start > end else Window(core.start, min(core.end, end))
        return Window(self.start, min(self.end, end), core)

    def distance(self, ts: datetime) -> timedelta:
        """Time from ``ts`` to the nearest point of the window (zero inside)."""
        if ts < self.start:
            return self.start - ts
        if ts > self.end:
            return ts - self.end
        return timedelta(0)

    def to_json(self, granularity: Granularity) -> dict:
        return {"start": format_time(self.start, granularity), "end": format_time(self.end, granularity)}


@dataclass(frozen=True)
class WindowPrediction:
    """What a window source says about a query: does it need time, and where to look."""

    temporal: bool
    windows: tuple[Window, ...] = ()

    def to_json(self, granularity: Granularity) -> dict:
        return {"temporal": self.temporal, "windows": [w.to_json(granularity) for w in self.windows]}


NON_TEMPORAL = WindowPrediction(temporal=False, windows=())


@dataclass(frozen=True)
class Message:
    """One memory item. ``id`` is its position in the time-sorted memory; ``key`` is the
    id in the source data (e.g. LoCoMo ``dia_id`` ``"D3:7"``)."""

    id: int
    key: str
    text: str
    timestamp: datetime
    speaker: str
    session: str
    channel: str | None = None
    topic: str | None = None
    phase: str | None = None
    stage: int | None = None
    role: str | None = None
    # The user's own fields (mem0/Zep "metadata"), sorted (name, value) pairs so a message
    # stays hashable; values are strings, numbers or booleans. ``dict(m.metadata)`` reads them.
    metadata: tuple[tuple[str, str | int | float | bool], ...] = ()


def renumbered(message: Message, i: int) -> Message:
    """``replace(message, id=i)`` without ``__init__`` (a third of its time): memories
    renumber every later message when one moves."""
    out = object.__new__(Message)
    out.__dict__.update(message.__dict__, id=i)
    return out


class Memory:
    """A conversation's messages, sorted by time, with O(log n) window -> id-range lookup.

    A removal does not renumber the later messages at once (at 100k messages that took a
    second of Python): each stored message keeps the id it had at the last renumbering,
    ``_gone`` holds the old ids removed since, and a position is its old id less the removed
    ids below it. Reads renumber what they hand out (``memory[i]``, ``slice``); ``messages``
    renumbers the whole list once, for the readers that walk all of it anyway."""

    def __init__(self, key: str, messages: Sequence[Message], granularity: Granularity = "day"):
        ordered = sorted(messages, key=lambda m: (m.timestamp, m.id))
        # Re-number so that id == position: every index and id range relies on it.
        self._messages: list[Message] = [renumbered(m, i) for i, m in enumerate(ordered)]
        self.key = key
        self.granularity: Granularity = granularity
        self.timestamps: list[datetime] = [m.timestamp for m in self._messages]
        self._by_key = {m.key: m.id for m in self._messages}  # key -> id at the last renumbering
        self._gone: list[int] = []  # ids (at the last renumbering) removed since, sorted

    @property
    def messages(self) -> list[Message]:
        """Every message, ``id`` its position (renumbers the list once after removals)."""
        if self._gone:
            first = self._gone[0]
            self._messages[first:] = [renumbered(m, i) for i, m in enumerate(self._messages[first:], first)]
            self._by_key.update((m.key, m.id) for m in self._messages[first:])
            self._gone = []
        return self._messages

    def copy(self) -> Memory:
        """A memory with the same messages whose later changes leave this one as it is."""
        out = Memory.__new__(Memory)
        out.key, out.granularity = self.key, self.granularity
        out._messages, out.timestamps, out._by_key = list(self._messages), list(self.timestamps), dict(self._by_key)
        out._gone = list(self._gone)
        return out

    def slice(self, start: int, stop: int) -> list[Message]:
        """The messages at positions ``start .. stop - 1``, ``id`` their position."""
        return [self[i] for i in range(max(start, 0), min(stop, len(self._messages)))]

    def append(self, messages: Sequence[Message]) -> None:
        """Add messages that sort after every stored one (by time, then by the given id),
        numbered on from ``len(self)``: the in-order fast path of an incremental memory."""
        if not messages:
            return
        ordered = sorted(messages, key=lambda m: (m.timestamp, m.id))
        if self._messages and ordered[0].timestamp < self.timestamps[-1]:
            raise ValueError(f"memory {self.key!r}: append() needs messages at or after {self.timestamps[-1]}")
        start = len(self._messages) + len(self._gone)  # ids as of the last renumbering
        for i, m in enumerate(ordered, start):
            m = renumbered(m, i)
            self._messages.append(m)
            self.timestamps.append(m.timestamp)
            self._by_key[m.key] = i

    def remove(self, positions: Sequence[int]) -> None:
        """Take the messages at ``positions`` out; the later ones move up (their ids follow
        lazily, see the class docstring)."""
        gone = sorted({int(p) for p in positions}, reverse=True)
        old_ids = [self._messages[p].id for p in gone]
        for p, old in zip(gone, old_ids):
            del self._by_key[self._messages[p].key]
            del self._messages[p], self.timestamps[p]  # a memmove each: C speed
        for old in old_ids:
            bisect.insort(self._gone, old)

    def put(self, position: int, message: Message) -> None:
        """``message`` (same key) in place of the one at ``position``; its time must keep the order."""
        self._messages[position] = renumbered(message, self._messages[position].id)
        self.timestamps[position] = message.timestamp

    def __len__(self) -> int:
        return len(self._messages)

    def __getitem__(self, i: int) -> Message:
        if isinstance(i, slice):
            return self.messages[i]
        i = i + len(self._messages) if i < 0 else i
        m = self._messages[i]
        return m if m.id == i else renumbered(m, i)

    def __iter__(self):
        return iter(self.messages)

    def id_of(self, key: str) -> int | None:
        """The id of the message whose source key is ``key`` (None if there is none)."""
        old = self._by_key.get(key)
        if old is None or not self._gone:
            return old
        return old - bisect.bisect_left(self._gone, old)

    def id_range(self, window: Window) -> tuple[int, int]:
        """Half-open id range ``[lo, hi)`` of the messages inside the closed ``window``."""
        lo = bisect.bisect_left(self.timestamps, window.start)
        hi = bisect.bisect_right(self.timestamps, window.end)
        return lo, hi

    @property
    def span(self) -> Window:
        if not self.messages:
            raise ValueError(f"memory {self.key!r} is empty")
        return Window(self.timestamps[0], self.timestamps[-1])

    @property
    def sessions(self) -> list[str]:
        return list(dict.fromkeys(m.session for m in self.messages))


@dataclass(frozen=True)
class Gold:
    """Evaluation-only labels. The inference path never reads these."""

    answer: str | None = None
    evidence_ids: tuple[int, ...] = ()
    windows: tuple[Window, ...] = ()
    temporal: bool = False
    unresolved_evidence: tuple[str, ...] = ()  # raw evidence refs that matched no message
    # LoCoMo category 5: the tempting wrong answer that a good reader rejects.
    adversarial_answer: str | None = None


@dataclass(frozen=True)
class Query:
    """A question asked of a memory. ``key`` is stable across runs (used to resume)."""

    key: str
    memory_key: str
    text: str
    asked_at: datetime
    user: str | None = None
    category: str | None = None
    gold: Gold = field(default_factory=Gold, repr=False, compare=False)

    def public(self) -> Query:
        """The query as the inference path may see it: gold labels stripped."""
        return replace(self, gold=Gold())


@dataclass
class Dataset:
    """A loaded benchmark: memories by key, queries, and loader statistics."""

    name: str
    granularity: Granularity
    memories: dict[str, Memory]
    queries: list[Query]
    stats: dict = field(default_factory=dict)  # loader-specific counts (unresolved evidence ...)

    def memory_of(self, query: Query) -> Memory:
        return self.memories[query.memory_key]


WINDOW_BUCKETS = ("0", "1", "2", ">=3")  # gold-window-count buckets, in report order


def window_bucket(n_windows: int) -> str:
    """Gold-window-count bucket used in reports and DAR: one of ``WINDOW_BUCKETS``."""
    return str(n_windows) if n_windows < 3 else ">=3"
