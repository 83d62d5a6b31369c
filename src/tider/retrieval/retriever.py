"""The dual-channel retriever (TIDER Sec. 3).

For a query q and a window prediction P:

1. ``sim`` = per-message similarity in [0, 1] from the semantic mode (dense / bm25 /
   hybrid RRF, k=60; formulas in ``tider.retrieval.channels``).
2. Non-temporal P (``temporal=False`` or no windows), or ``config.temporal=False``:
   return the semantic channel, the top-k of ``sim``, scored by ``sim``.
3. Otherwise: semantic channel = top-k of ``sim`` over all messages; temporal channel =
   the messages inside the windows widened by ``tau_buf``, ranked by their decayed
   similarity (the rerank score below). Their union is reranked by distance decay
   (``tider.retrieval.rerank``):
       score(m) = sim(m) * max(gamma_min, exp(-rho * d(m))) + lambda_boost * [d(m) == 0]
   with d(m) the distance in days to the nearest (unwidened) window, and the top-k returned.

Why the temporal channel ranks by the decayed score and not by raw ``sim``: with
tau_buf = 14 days the widened window holds several sessions, and its raw-similarity
top-k is mostly *neighbours* of the window; the in-window evidence then never reaches
the merge. Measured on LoCoMo dev with gold windows: recall@20 0.742 (raw sim) vs 0.864
(decayed), against 0.544 without windows. Since the final top-k is taken over the same
score, "top-k of the temporal channel, merged" equals "score every in-range message".

Results are ``(ids, scores)``, best first, ties broken by lower id (earlier message).
``tider.memory`` calls this with exact score vectors (small memories, ``exact=True``) and
with index-backed candidate lists (``tider.memory.index``), so both paths rank alike.
"""

from __future__ import annotations

import numpy as np

from tider.retrieval import channels
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.rerank import rerank_scores
from tider.types import WindowPrediction


def exact_similarity(
    dense_scores: np.ndarray | None, bm25_scores: np.ndarray | None, config: RetrievalConfig, mode: str | None = None
) -> np.ndarray:
    """``sim`` of every message from its full dense and BM25 score vectors (exact scoring)."""
    return channels.semantic_similarity(
        dense_scores, bm25_scores, mode or config.semantic, config.rrf_k, config.rrf_depth
    )


def dual_channel_rank(
    sim: np.ndarray,
    ts_days: np.ndarray,
    prediction: WindowPrediction,
    config: RetrievalConfig,
    k: int | None = None,
    semantic_order: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Dual-channel ``(ids, scores)`` for one prediction over the messages ``sim`` covers
    (``ts_days`` aligned with it). ``semantic_order`` (ids sorted by ``sim``, best first)
    may be passed in when cached, to skip the top-k selection."""
    k = config.k if k is None else k
    semantic = semantic_order[:k] if semantic_order is not None else channels.top_k(sim, k)
    if not (config.temporal and prediction.temporal and prediction.windows):
        return semantic, sim[semantic]
    windows = channels.window_days(prediction.windows)
    ranges = channels.id_ranges(ts_days, windows, config.tau_buf_days)
    candidates = np.union1d(semantic, channels.ids_in_ranges(ranges))
    return rerank_top_k(candidates, sim[candidates], ts_days[candidates], windows, config, k)


def rerank_top_k(
    candidates: np.ndarray, sim: np.ndarray, ts_days: np.ndarray, windows: np.ndarray, config: RetrievalConfig, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The distance-decay score of each candidate, top-``k`` best first (ties: lower id)."""
    scores = rerank_scores(sim, ts_days, windows, config.lambda_boost, config.gamma_min, config.rho_per_day)
    order = np.lexsort((candidates, -scores))[:k]
    return candidates[order], scores[order].astype(np.float32)
