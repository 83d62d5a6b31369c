"""Timeline memory: messages merged chronologically into event clusters (TIDER Table 13).

Walk the messages in time order with one open cluster. A message joins it when all hold:
  * it is at most ``delta_date`` after the cluster's last message,
  * its cosine similarity to the cluster reaches ``theta_sem`` (``centroid``: the
    normalised mean of the member embeddings; ``max``: the closest member),
  * the cluster has fewer than ``cap`` members;
otherwise the cluster closes and the message opens a new one. Each closed cluster becomes
a ``TimelineEntry(start, end, member_ids)``.

Why centroid similarity and theta 0.35 by default (not 0.85): MiniLM similarities
between consecutive chat turns are rarely >= 0.85, so the paper value yields one entry
per turn (``bench/sweep_timeline.py`` on LoCoMo dev: 587 entries per conversation, 1.0
message each); 0.35 with centroid similarity gives about session-sized entries (58 per
conversation, 10 messages each), which keeps the K=30 locator prompt informative and short.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from tider.retrieval.config import TimelineConfig, days
from tider.types import Memory, Window


@dataclass(frozen=True)
class TimelineEntry:
    start: datetime
    end: datetime
    member_ids: tuple[int, ...]

    @property
    def window(self) -> Window:
        return Window(self.start, self.end)


class Timeline:
    """Event clusters with their (normalised) embeddings; ``top_k`` ranks them by cosine.

    Clusters are contiguous position ranges of the memory (``starts[j]`` .. the next
    start), so a timeline grown by ``extend`` reads exactly like one built from all
    messages at once.
    """

    def __init__(
        self,
        memory: Memory,
        starts: Sequence[int],
        vectors: np.ndarray,
        embeddings: np.ndarray,
        embedder=None,
        end: int | None = None,
    ):
        self.memory = memory
        self.embeddings = embeddings  # rows = positions of ``memory``
        self.starts = [int(s) for s in starts]
        self.vectors = np.asarray(vectors, dtype=np.float32).reshape(len(self.starts), -1)
        self.embedder = embedder
        self.end = len(memory) if end is None else end  # positions at or past it are not (yet) said
        self.parent: Timeline | None = None  # the full timeline of a ``visible`` view
        self._entries: dict[int, TimelineEntry] = {}

    def __len__(self) -> int:
        return len(self.starts)

    def members(self, j: int) -> range:
        end = self.starts[j + 1] if j + 1 < len(self.starts) else self.end
        return range(self.starts[j], end)

    def visible(self, asked_at: datetime | None) -> Timeline:
        """The timeline as it stood at ``asked_at`` (docs/design.md, decision 10, no memory from the
        future): clusters that started later are gone, and the one still open then is cut
        to the members said by then (its centroid from those alone). Entries
        of clusters that had closed are the full timeline's own (shared caches)."""
        if asked_at is None:
            return self
        import bisect

        hi = bisect.bisect_right(self.memory.timestamps, asked_at, 0, self.end)
        if hi >= self.end:
            return self
        n = bisect.bisect_left(self.starts, hi)  # clusters that started before hi
        vectors = self.vectors[:n].copy()
        if n:
            vectors[n - 1] = centroids(self.embeddings, [range(self.starts[n - 1], hi)])[0]
        view = Timeline(self.memory, self.starts[:n], vectors, self.embeddings, self.embedder, end=hi)
        view.parent = self
        return view

    def span(self, j: int) -> Window:
        """Cluster ``j``'s ``[first, last]`` message time."""
        members = self.members(j)
        return Window(self.memory.timestamps[members[0]], self.memory.timestamps[members[-1]])

    def entry(self, j: int) -> TimelineEntry:
        if j not in self._entries and self.parent is not None and self.members(j) == self.parent.members(j):
            self._entries[j] = self.parent.entry(j)
        if j not in self._entries:
            ids = tuple(self.members(j))
            self._entries[j] = TimelineEntry(self.memory.timestamps[ids[0]], self.memory.timestamps[ids[-1]], ids)
        return self._entries[j]

    @property
    def entries(self) -> list[TimelineEntry]:
        return [self.entry(j) for j in range(len(self))]

    def scores(self, query: str | np.ndarray) -> np.ndarray:
        if isinstance(query, str):
            if self.embedder is None:
                raise ValueError("Timeline built without an embedder: pass a query vector, not text")
            query = self.embedder.encode([query])[0]
        return self.vectors @ np.asarray(query, dtype=np.float32).reshape(-1)

    def top_k(self, query: str | np.ndarray, k: int) -> list[TimelineEntry]:
        """The ``k`` entries most similar to the query, best first (ties: earlier first)."""
        if not self.starts:
            return []
        order = np.argsort(-self.scores(query), kind="stable")[:k]
        return [self.entry(int(j)) for j in order]

    def extend(self, memory: Memory, embeddings: np.ndarray, config: TimelineConfig, first_changed: int) -> Timeline:
        """The timeline of ``memory`` (this one's memory with messages added from position
        ``first_changed`` on): clusters that closed before it are kept, the greedy merge
        re-runs from the start of the cluster holding ``first_changed - 1``."""
        keep = 0
        if first_changed > 0 and self.starts:
            keep = int(np.searchsorted(self.starts, first_changed - 1, side="right")) - 1
        start = self.starts[keep] if self.starts and keep >= 0 else 0
        keep = max(keep, 0)
        tail = cluster_messages(memory.timestamps, embeddings, config, start=start)
        starts = self.starts[:keep] + [c[0] for c in tail]
        vectors = np.concatenate([self.vectors[:keep], centroids(embeddings, tail)]) if tail else self.vectors[:keep]
        return Timeline(memory, starts, vectors, embeddings, self.embedder)


def cluster_messages(
    timestamps: Sequence[datetime], embeddings: np.ndarray, config: TimelineConfig, start: int = 0
) -> list[list[int]]:
    """The greedy chronological merge from the module docstring over positions ``start ..``
    (the first opens a cluster); returns member id lists."""
    gap = days(config.delta_date_days)
    clusters: list[list[int]] = []
    total = None
    for i in range(start, len(timestamps)):
        ts, vec = timestamps[i], embeddings[i]
        if clusters:
            members = clusters[-1]
            if config.similarity == "centroid":
                sim = float(vec @ total) / max(float(np.linalg.norm(total)), 1e-12)
            else:
                sim = float(np.max(embeddings[members] @ vec))
            if ts - timestamps[members[-1]] <= gap and sim >= config.theta_sem and len(members) < config.cap:
                members.append(i)
                total = total + vec
                continue
        clusters.append([i])
        total = vec.astype(np.float64).copy()
    return clusters


def centroids(embeddings: np.ndarray, clusters: Sequence[Sequence[int]]) -> np.ndarray:
    out = []
    for members in clusters:
        centre = embeddings[list(members)].mean(axis=0)
        out.append(centre / max(float(np.linalg.norm(centre)), 1e-12))
    dim = embeddings.shape[1] if embeddings.ndim == 2 else 0
    return np.array(out, dtype=np.float32).reshape(-1, dim)


def build_timeline(
    memory: Memory,
    embedder,
    config: TimelineConfig | None = None,
    embeddings: np.ndarray | None = None,
) -> Timeline:
    """Cluster ``memory`` into a ``Timeline``. ``embeddings`` (rows = message ids) skips re-encoding."""
    config = config or TimelineConfig()
    if embeddings is None:
        embeddings = embedder.encode([m.text for m in memory])
    clusters = cluster_messages(memory.timestamps, embeddings, config)
    return Timeline(memory, [c[0] for c in clusters], centroids(embeddings, clusters), embeddings, embedder)
