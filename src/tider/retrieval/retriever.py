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
"""

from __future__ import annotations

import numpy as np

from tider.retrieval import channels
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.rerank import rerank_scores
from tider.types import Memory, WindowPrediction


class DualChannelRetriever:
    """Ranks one memory's messages for a query. Holds no per-query state: callers cache
    ``similarity`` (the expensive, window-independent part) and call ``rank`` per prediction."""

    def __init__(self, memory: Memory, bm25, dense, config: RetrievalConfig, embedder=None):
        self.memory, self.bm25, self.dense, self.config, self.embedder = memory, bm25, dense, config, embedder
        self.ts_days = np.array([channels.to_days(t) for t in memory.timestamps], dtype=np.float64)

    def similarity(self, text: str, vector: np.ndarray | None = None, mode: str | None = None) -> np.ndarray:
        mode = mode or self.config.semantic
        dense = bm25 = None
        if mode in ("dense", "hybrid"):
            if vector is None:
                vector = self.embedder.encode([text])[0]
            dense = self.dense.scores(vector)
        if mode in ("bm25", "hybrid"):
            bm25 = self.bm25.scores(text)
        return channels.semantic_similarity(dense, bm25, mode, self.config.rrf_k)

    def rank(self, sim: np.ndarray, prediction: WindowPrediction, k: int | None = None,
             semantic_order: np.ndarray | None = None, visible: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Dual-channel ranking for one prediction. ``semantic_order`` (ids sorted by
        ``sim``, best first) may be passed in when cached, to skip the top-k selection.
        ``visible``: only ids below it exist (the messages said by the question's time)."""
        cfg = self.config
        k = cfg.k if k is None else k
        if visible is not None and visible < sim.shape[0]:
            if semantic_order is not None:
                semantic = semantic_order[semantic_order < visible][:k]
            else:
                semantic = channels.top_k(sim, k, np.arange(visible))
        else:
            visible = None
            semantic = semantic_order[:k] if semantic_order is not None else channels.top_k(sim, k)
        if not (cfg.temporal and prediction.temporal and prediction.windows):
            return semantic, sim[semantic]
        windows = channels.window_days(prediction.windows)
        ranges = channels.id_ranges(self.ts_days, windows, cfg.tau_buf_days)
        if visible is not None:
            ranges = [(a, min(b, visible)) for a, b in ranges if a < visible]
        candidates = np.union1d(semantic, channels.ids_in_ranges(ranges))
        scores = rerank_scores(sim[candidates], self.ts_days[candidates], windows, cfg.lambda_boost, cfg.gamma_min,
                               cfg.rho_per_day)
        order = np.lexsort((candidates, -scores))[:k]
        return candidates[order], scores[order].astype(np.float32)

    def retrieve(self, text: str, prediction: WindowPrediction, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self.rank(self.similarity(text), prediction, k)
