"""Timeline memory: messages merged chronologically into event clusters (TIDER Table 13).

Walk the messages in time order with one open cluster. A message joins it when all hold:
  * it is at most ``delta_date`` after the cluster's last message,
  * its cosine similarity to the cluster reaches ``theta_sem`` (``centroid``: the
    normalised mean of the member embeddings; ``max``: the closest member),
  * the cluster has fewer than ``cap`` members;
otherwise the cluster closes and the message opens a new one. Each closed cluster becomes
a ``TimelineEntry(start, end, member_ids, summary)``.

Why centroid similarity and theta 0.35 by default (not 0.85): MiniLM similarities
between consecutive chat turns are rarely >= 0.85, so the paper value yields one entry
per turn (``bench/sweep_timeline.py`` on LoCoMo dev: 587 entries per conversation, 1.0
message each); 0.35 with centroid similarity gives about session-sized entries (58 per
conversation, 10 messages each), which keeps the K=30 locator prompt informative and short.

Summaries go through the ``Summarizer`` protocol: ``ExtractiveSummarizer`` (default,
deterministic: TF-IDF keywords plus the member closest to the centroid, clipped) or any
LLM-backed object with the same ``summarize`` method.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, Sequence

import numpy as np

from tider.retrieval.config import TimelineConfig, days
from tider.types import Memory, Window


@dataclass(frozen=True)
class TimelineEntry:
    start: datetime
    end: datetime
    member_ids: tuple[int, ...]
    summary: str

    @property
    def window(self) -> Window:
        return Window(self.start, self.end)


class Summarizer(Protocol):
    def summarize(self, memory: Memory, member_ids: Sequence[int], embeddings: np.ndarray) -> str: ...


def _clip_words(text: str, n: int) -> str:
    words = text.split()
    return " ".join(words[:n]) + (" ..." if len(words) > n else "")


class ExtractiveSummarizer:
    """Deterministic summary: speakers, the cluster's most distinctive words (TF-IDF of the
    cluster against the whole memory, speaker names excluded) and its most central
    message clipped to ``words`` words. Keywords make an entry findable by the locator even
    when the central turn is small talk ("Wow, that's great!")."""

    def __init__(self, words: int = 24, keywords: int = 6):
        self.words, self.keywords = words, keywords
        self._df: dict[str, tuple[int, dict[str, int]]] = {}

    def _doc_freq(self, memory: Memory) -> dict[str, int]:
        from collections import Counter

        from tider.retrieval.bm25 import tokenize

        if memory.key not in self._df:
            df = Counter(t for m in memory for t in set(tokenize(m.text)))
            self._df[memory.key] = (len(memory), df)
        return self._df[memory.key][1]

    def top_keywords(self, memory: Memory, member_ids: Sequence[int]) -> list[str]:
        import math
        from collections import Counter

        from tider.retrieval.bm25 import tokenize

        df = self._doc_freq(memory)
        names = {t for i in member_ids for t in tokenize(memory[i].speaker)}
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

        tf = Counter(t for i in member_ids for t in tokenize(memory[i].text)
                     if len(t) > 2 and t not in names and t not in ENGLISH_STOP_WORDS and not t.isdigit())
        n = len(memory)
        scored = sorted(tf, key=lambda t: (-tf[t] * math.log((1 + n) / (1 + df.get(t, 0))), t))
        return scored[: self.keywords]

    def summarize(self, memory: Memory, member_ids: Sequence[int], embeddings: np.ndarray) -> str:
        vecs = embeddings[list(member_ids)]
        centre = vecs.mean(axis=0)
        best = member_ids[int(np.argmax(vecs @ centre))]
        speakers = ", ".join(dict.fromkeys(memory[i].speaker for i in member_ids))
        keywords = ", ".join(self.top_keywords(memory, member_ids))
        extra = f" (+{len(member_ids) - 1} msgs)" if len(member_ids) > 1 else ""
        return f"{speakers} | {keywords} | {_clip_words(memory[best].text, self.words)}{extra}"


class Timeline:
    """Event clusters with their (normalised) embeddings; ``top_k`` ranks them by cosine."""

    def __init__(self, entries: Sequence[TimelineEntry], vectors: np.ndarray, embedder=None):
        if len(entries) != len(vectors):
            raise ValueError(f"{len(entries)} timeline entries but {len(vectors)} vectors")
        self.entries = list(entries)
        self.vectors = np.asarray(vectors, dtype=np.float32)
        self.embedder = embedder

    def __len__(self) -> int:
        return len(self.entries)

    def scores(self, query: str | np.ndarray) -> np.ndarray:
        if isinstance(query, str):
            if self.embedder is None:
                raise ValueError("Timeline built without an embedder: pass a query vector, not text")
            query = self.embedder.encode([query])[0]
        return self.vectors @ np.asarray(query, dtype=np.float32).reshape(-1)

    def top_k(self, query: str | np.ndarray, k: int) -> list[TimelineEntry]:
        """The ``k`` entries most similar to the query, best first (ties: earlier first)."""
        if not self.entries:
            return []
        order = np.argsort(-self.scores(query), kind="stable")[:k]
        return [self.entries[i] for i in order]


def cluster_messages(timestamps: Sequence[datetime], embeddings: np.ndarray, config: TimelineConfig) -> list[list[int]]:
    """The greedy chronological merge from the module docstring; returns member id lists."""
    gap = days(config.delta_date_days)
    clusters: list[list[int]] = []
    total = None
    for i, ts in enumerate(timestamps):
        vec = embeddings[i]
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


def build_timeline(memory: Memory, embedder, config: TimelineConfig | None = None, summarizer: Summarizer | None = None,
                   embeddings: np.ndarray | None = None) -> Timeline:
    """Cluster ``memory`` into a ``Timeline``. ``embeddings`` (rows = message ids) skips re-encoding."""
    config = config or TimelineConfig()
    summarizer = summarizer or ExtractiveSummarizer(config.summary_words)
    if embeddings is None:
        embeddings = embedder.encode([m.text for m in memory])
    entries, vectors = [], []
    for members in cluster_messages(memory.timestamps, embeddings, config):
        centre = embeddings[members].mean(axis=0)
        vectors.append(centre / max(float(np.linalg.norm(centre)), 1e-12))
        entries.append(TimelineEntry(memory.timestamps[members[0]], memory.timestamps[members[-1]], tuple(members),
                                     summarizer.summarize(memory, members, embeddings)))
    dim = embeddings.shape[1] if embeddings.ndim == 2 else 0
    return Timeline(entries, np.array(vectors, dtype=np.float32).reshape(-1, dim), embedder)
