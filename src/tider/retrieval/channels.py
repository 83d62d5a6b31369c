"""The two retrieval channels over one per-query similarity vector.

``semantic_similarity`` turns the raw channel scores into ``sim`` in [0, 1]:
  dense  : max(cos, 0)
  bm25   : bm25 / max(bm25) (all zero when no query term occurs)
  hybrid : reciprocal rank fusion of the dense and BM25 rankings,
           (rrf_k + 1) / 2 * sum_c 1 / (rrf_k + rank_c)   (rank 1-based; the best possible
           message, first in both, scores 1). Ranks past ``rrf_depth`` contribute 0, the
           usual RRF cut-off, which keeps 1M-message memories off a full sort.
The semantic channel is the top-k of ``sim`` over all messages; the temporal channel is
the top-k of ``sim`` inside the predicted windows widened by ``tau_buf`` (id ranges, since
ids are sorted by time).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np

from tider.scoring import merge_intervals
from tider.types import Window

EPOCH = datetime(1970, 1, 1)


def to_days(ts: datetime) -> float:
    """Naive-UTC datetime -> days since the epoch (float; no local-time conversion)."""
    return (ts - EPOCH).total_seconds() / 86400.0


def ranked_ids(scores: np.ndarray, depth: int | None = None) -> np.ndarray:
    """Ids of the ``depth`` best rows, best first (ties: lower id first); all rows if
    ``depth`` is None or covers them."""
    n = scores.shape[0]
    if depth is not None and depth < n:
        # argpartition keeps any of the rows tied with the depth-th score; keep the earliest,
        # as the order promises (a backend ranking in SQL keeps those too)
        kth = scores[np.argpartition(-scores, depth - 1)[depth - 1]]
        above = np.flatnonzero(scores > kth)
        top = np.concatenate([above, np.flatnonzero(scores == kth)[: depth - len(above)]])
        return top[np.lexsort((top, -scores[top]))]
    return np.lexsort((np.arange(n), -scores))


def ranks_of(scores: np.ndarray, depth: int | None = None) -> np.ndarray:
    """1-based rank of every row (ties: lower id first); rows past ``depth`` get +inf."""
    ranks = np.full(scores.shape[0], np.inf)
    top = ranked_ids(scores, depth)
    ranks[top] = np.arange(1, len(top) + 1)
    return ranks


def rrf_similarity(dense_ranks: np.ndarray, bm25_ranks: np.ndarray | None, rrf_k: int) -> np.ndarray:
    """Hybrid ``sim`` from 1-based ranks (+inf = unranked), arithmetic as in
    ``semantic_similarity`` so both give the same floats for the same ranks."""
    fused = 1.0 / (rrf_k + dense_ranks)
    if bm25_ranks is not None:
        fused = fused + 1.0 / (rrf_k + bm25_ranks)
    return (fused * (rrf_k + 1) / 2.0).astype(np.float32)


def semantic_similarity(
    dense: np.ndarray | None, bm25: np.ndarray | None, mode: str, rrf_k: int = 60, rrf_depth: int | None = 1000
) -> np.ndarray:
    if mode == "dense":
        return np.maximum(dense, 0.0).astype(np.float32)
    if mode == "bm25":
        top = float(bm25.max()) if bm25.size else 0.0
        return (bm25 / top).astype(np.float32) if top > 0 else np.zeros_like(bm25, dtype=np.float32)
    if mode == "hybrid":
        # no lexical match: the BM25 ranking is noise, skip it
        lexical = bm25.size and float(bm25.max()) > 0
        return rrf_similarity(ranks_of(dense, rrf_depth), ranks_of(bm25, rrf_depth) if lexical else None, rrf_k)
    raise ValueError(f"unknown semantic mode {mode!r}; known: dense, bm25, hybrid")


def top_k(sim: np.ndarray, k: int, candidates: np.ndarray | None = None) -> np.ndarray:
    """Ids of the ``k`` best ``sim`` values (among ``candidates`` if given), best first,
    ties broken by lower id."""
    ids = np.arange(sim.shape[0]) if candidates is None else candidates
    if ids.size == 0 or k <= 0:
        return ids[:0]
    vals = sim[ids]
    if k < ids.size:
        part = np.argpartition(-vals, k - 1)[:k]
        ids, vals = ids[part], vals[part]
    return ids[np.lexsort((ids, -vals))][:k]


def window_days(windows: Sequence[Window]) -> np.ndarray:
    """``(w, 2)`` float days ``[start, end]`` per window."""
    return np.array([[to_days(w.start), to_days(w.end)] for w in windows], dtype=np.float64).reshape(-1, 2)


def id_ranges(ts_days: np.ndarray, windows: np.ndarray, buffer_days: float = 0.0) -> list[tuple[int, int]]:
    """Half-open id ranges of messages inside each window widened by ``buffer_days``
    (same convention as ``Memory.id_range``), merged where they overlap."""
    lo = np.searchsorted(ts_days, windows[:, 0] - buffer_days, side="left")
    hi = np.searchsorted(ts_days, windows[:, 1] + buffer_days, side="right")
    return merge_intervals((a, b) for a, b in zip(lo.tolist(), hi.tolist()) if b > a)


def ids_in_ranges(ranges: Sequence[tuple[int, int]]) -> np.ndarray:
    if not ranges:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(a, b) for a, b in ranges])
