"""The dual-channel retriever: a semantic channel and a temporal channel, fused by rank.

For a query q and a window prediction P:

1. ``sim`` = per-message similarity in [0, 1] from the semantic mode (dense / bm25 /
   hybrid RRF of the two; formulas in ``tider.retrieval.channels``). The **semantic
   channel** ranks every message the query may see by ``sim``.
2. Non-temporal P (``temporal=False`` or no windows), or ``config.temporal=False``:
   the answer is the semantic channel's top-k, scored by ``sim``.
3. Otherwise the **temporal channel** ranks the messages inside P's windows by ``sim``,
   halved in a window's pad (``Window.core``: ``rules`` pads the day a question names by a
   day on each side), ties to the anchor, then to the earlier message: where similarity does
   not separate the window's messages, closeness to what was asked does (TIDER's distance
   decay, inside the window only).
   Each channel nominates its top k, and the nominations are fused by reciprocal rank, as
   the dense and lexical rankings are fused inside the hybrid mode (same ``rrf_k``, same
   scale):

       score(m) = (rrf_k + 1) / 2 * (1 / (rrf_k + r_sem(m)) + 1 / (rrf_k + r_win(m)))

   with a rank past k (or outside the windows) infinite. The top k by that score (ties:
   the window's message, then the earlier one) is the answer: what both channels nominate leads, then
   the two lists alternate, so a window alone can take at most half of the top k.

Why this and not TIDER's rerank (``sim * max(gamma_min, exp(-rho d)) + lambda_boost *
[inside]``, over windows widened by 14 days): a window must promote the messages inside it,
never take the top k over, because a locator is sometimes wrong. Measured on the dev data
(mean per-question share of the evidence in the top 20; ``bench/bench_regret.py``), TIDER's
rerank lets one wrong one-day window drop LoCoMo from 0.642 (no window) to 0.114 while gold
windows reach 0.937. Fusing the full rankings by reciprocal rank halves that cost (0.452,
gold 0.932), but every window message still carries its deep semantic rank into the sum, so
the window takes more than half of the top k; nominating each channel's top k first makes
the split exact: a wrong window costs 0.642 -> 0.558, gold windows reach 0.873, and a window
on the day of the top semantic hit helps on average (0.685). RealMem: none 0.389, gold
0.861 / 0.904 / 0.819, wrong 0.178 / 0.311 / 0.328; synthetic: gold 1.000 in all three,
wrong 0.244 / 0.412 / 0.412. A buffer around the windows with distance decay made wrong
windows costlier and gold ones no better, so the temporal channel is the windows themselves.
The nomination depth is the retrieval budget k, not a tuned constant.

Results are ``(ids, scores)``, best first. ``tider.memory`` calls this with exact score
vectors (small memories, ``exact=True``) and, through ``fuse_ranks``, with index-backed
candidate lists (``tider.memory.index``), so both paths rank alike.
"""

from __future__ import annotations

import numpy as np

from tider.retrieval import channels
from tider.retrieval.config import RetrievalConfig
from tider.types import WindowPrediction


def exact_similarity(
    dense_scores: np.ndarray | None, bm25_scores: np.ndarray | None, config: RetrievalConfig, mode: str | None = None
) -> np.ndarray:
    """``sim`` of every message from its full dense and BM25 score vectors (exact scoring)."""
    return channels.semantic_similarity(
        dense_scores, bm25_scores, mode or config.semantic, config.rrf_k, config.rrf_depth
    )


# A message in a window's pad (outside its anchor) counts this share of its similarity in the
# temporal channel: to outrank a message of the day the question names it must be twice as
# similar. Near-identical messages (a recurring event) then rank by closeness to the anchor,
# where they used to rank by age, and a clearly better pad message still leads.
PAD_WEIGHT = 0.5


def temporal_key(sim: np.ndarray, in_core: np.ndarray) -> np.ndarray:
    """The temporal channel's ranking score: ``sim``, halved in a window's pad (TIDER's
    distance decay at one step: the pad is one unit from the anchor)."""
    return np.where(in_core, sim, sim * PAD_WEIGHT)


def uses_windows(prediction: WindowPrediction, config: RetrievalConfig) -> bool:
    return bool(config.temporal and prediction.temporal and prediction.windows)


def dual_channel_rank(
    sim: np.ndarray,
    ts_days: np.ndarray,
    prediction: WindowPrediction,
    config: RetrievalConfig,
    k: int | None = None,
    semantic_order: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Dual-channel ``(ids, scores)`` for one prediction over the messages ``sim`` covers
    (``ts_days`` aligned with it). ``semantic_order`` (every id sorted by ``sim``, best
    first, ties by lower id) may be passed in when cached."""
    k = config.k if k is None else k
    order = semantic_order if semantic_order is not None else channels.ranked_ids(sim)
    if not uses_windows(prediction, config):
        top = order[:k]
        return top, sim[top]
    inside = channels.ids_in_ranges(channels.id_ranges(ts_days, channels.window_days(prediction.windows)))
    core = channels.ids_in_ranges(channels.id_ranges(ts_days, channels.window_days(anchors(prediction))))
    pool = np.union1d(order[:k], inside)
    semantic_rank = np.full(len(pool), np.inf)
    semantic_rank[np.searchsorted(pool, order[:k])] = np.arange(1, min(k, len(order)) + 1)
    in_window, in_core = np.isin(pool, inside, assume_unique=True), np.isin(pool, core, assume_unique=True)
    return fuse_ranks(pool, sim[pool], semantic_rank, in_window, config.rrf_k, k, in_core)


def anchors(prediction: WindowPrediction) -> tuple:
    """The part of each window that was asked for (``Window.anchor``): the windows
    themselves unless a source widened them (``rules``' pad)."""
    return tuple(w.anchor for w in prediction.windows)


def fuse_ranks(
    pool: np.ndarray,
    sim: np.ndarray,
    semantic_rank: np.ndarray,
    inside: np.ndarray,
    rrf_k: int,
    k: int,
    core: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` of ``pool`` by the fused score (module docstring). ``pool`` holds every
    message that can reach the top k: the semantic top k and every message in the windows
    (or, on the index path, the first ones the temporal channel ranks); ``sim``,
    ``semantic_rank`` (1-based, inf past k or unranked), ``inside`` and ``core`` (in a
    window's anchor; None: every window message) are aligned with it.
    The temporal channel nominates its top k, ranked by ``temporal_key``."""
    members = pool[inside]
    in_core = np.ones(len(members), dtype=bool) if core is None else core[inside]
    window_order = np.lexsort((members, ~in_core, -temporal_key(sim[inside], in_core)))[:k]
    window_rank = np.full(len(pool), np.inf)
    window_rank[np.flatnonzero(inside)[window_order]] = np.arange(1, len(window_order) + 1)
    semantic_rank = np.where(semantic_rank <= k, semantic_rank, np.inf)
    scores = channels.rrf_similarity(semantic_rank, window_rank, rrf_k)
    # Ties (a rank in one list against the same rank in the other) go to the window's
    # message: the locator asked for it. Then the earlier message.
    best = np.lexsort((pool, np.isinf(window_rank), -scores))[:k]
    return pool[best], scores[best]
