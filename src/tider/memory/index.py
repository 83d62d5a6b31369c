"""The index-backed query path: candidate lists instead of a score for every message.

Exact scoring (``tider.retrieval.retriever``) computes the dense cosine and the BM25 score
of every message, turns both into ranks and fuses them (RRF, ranks past ``rrf_depth``
contribute 0). Here the same fusion runs over candidate lists:

* dense: the faiss top-``index_depth`` (``tider.retrieval.dense``: exact flat, or HNSW at
  scale), restricted to the past by an ``IDSelector``; the default depth is ``rrf_depth``
  (1000), the cut-off exact scoring uses, because a shallower list changes the fusion:
  measured, depth 100 kept the exact top-20 on 42% of queries at 10k messages and LoCoMo
  dev recall@20 fell 0.544 -> 0.528 (``bench/bench_retrieval.py --depths``);
  merged with the same depth of past messages ranked by their best chunk (the extra
  vectors of messages longer than the embedder's window, scanned exactly), each message
  keeping its best score (``best_per_message``), as exact scoring's max over its vectors;
* BM25: the top-``rrf_depth`` of the bm25s scores of the past, exactly the ranks the exact
  path gives them (one BM25 implementation for both paths);
* ``sim`` of a candidate = the RRF of its ranks, with the exact path's arithmetic, so a
  candidate ranked the same gets bit-identical ``sim``; every other message has sim 0.

The dual-channel rank then runs on the candidates: the semantic channel is their order;
the temporal channel ranks the candidates inside the windows (id ranges, since positions
are in time order) plus, from each window's id range, the earliest messages that are not
candidates (sim 0, ties broken by lower id: the exact path's order), and the two are fused
by rank (``tider.retrieval.retriever.fuse_ranks``). So with complete lists (a memory no
larger than the depths) this is the exact result; what it gives up at scale is the dense contribution of ranks between
``index_depth`` and ``rrf_depth`` and whatever HNSW misses (measured in
``bench/bench_retrieval.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tider.retrieval import channels
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.retriever import anchors, fuse_ranks, uses_windows
from tider.types import WindowPrediction


@dataclass
class Candidates:
    """One query's window-independent part: candidate positions (sorted by sim, best first)."""

    ids: np.ndarray  # positions in time order, best first
    sim: np.ndarray  # float32, aligned with ids
    cut: int  # positions [0, cut) are the past the query may see


def best_per_message(pos: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each position of a dense list once, with its best score, best first (ties: lower
    position): a long message's dense score is its best chunk's. Merging the top-``d`` of
    the messages' own vectors with the top-``d`` of their best chunks gives the exact
    top-``d`` by that score (a message in it is in one of the two lists)."""
    order = np.lexsort((pos, -scores))
    pos, scores = pos[order], scores[order]
    _, first = np.unique(pos, return_index=True)
    keep = np.sort(first)
    return pos[keep], scores[keep]


def fuse(
    dense_pos: np.ndarray | None,
    dense_scores: np.ndarray | None,
    bm25_scores: np.ndarray | None,
    mode: str,
    config: RetrievalConfig,
    cut: int,
) -> Candidates:
    """Candidate ``sim`` from a dense top list (positions + cosines) and the BM25 scores of
    the past (``bm25_scores[:cut]``), as the exact path would score them."""
    lexical = mode in ("bm25", "hybrid") and bm25_scores is not None and cut and float(bm25_scores.max()) > 0
    bm25_ids = channels.ranked_ids(bm25_scores, config.rrf_depth) if lexical else None
    return fuse_lists(dense_pos, dense_scores, bm25_ids, bm25_scores[bm25_ids] if lexical else None, mode, config, cut)


def fuse_lists(
    dense_pos: np.ndarray | None,
    dense_scores: np.ndarray | None,
    bm25_ids: np.ndarray | None,
    bm25_top: np.ndarray | None,
    mode: str,
    config: RetrievalConfig,
    cut: int,
) -> Candidates:
    """``fuse`` over a BM25 top list: ``bm25_ids`` best first (ties by position, cut at
    ``rrf_depth``; None when no past message shares a term with the query) and their
    scores ``bm25_top``. A database backend returns such lists (``tider.memory.pg``)."""
    empty = np.zeros(0, dtype=np.int64)
    dense_ids = empty
    if mode in ("dense", "hybrid") and dense_pos is not None and len(dense_pos):
        # graph and tail hits arrive together: one list, cut where exact scoring cuts it
        best_first = np.lexsort((dense_pos, -dense_scores))[: min(config.index_depth, config.rrf_depth)]
        dense_ids, dense_scores = dense_pos[best_first], dense_scores[best_first]
    lexical = mode in ("bm25", "hybrid") and bm25_ids is not None and len(bm25_ids) > 0
    if mode == "dense":
        ids, sim = (
            dense_ids,
            np.maximum(dense_scores, 0.0).astype(np.float32) if len(dense_ids) else np.zeros(0, np.float32),
        )
    elif mode == "bm25":
        ids = bm25_ids if lexical else empty
        sim = (bm25_top / float(bm25_top.max())).astype(np.float32) if lexical else np.zeros(0, np.float32)
    elif mode == "hybrid":
        ids = np.union1d(dense_ids, bm25_ids if lexical else empty)  # sorted, for searchsorted
        d_rank = np.full(len(ids), np.inf)
        d_rank[np.searchsorted(ids, dense_ids)] = np.arange(1, len(dense_ids) + 1)
        b_rank = None
        if lexical:
            b_rank = np.full(len(ids), np.inf)
            b_rank[np.searchsorted(ids, bm25_ids)] = np.arange(1, len(bm25_ids) + 1)
        sim = channels.rrf_similarity(d_rank, b_rank, config.rrf_k)
    else:
        raise ValueError(f"unknown semantic mode {mode!r}; known: dense, bm25, hybrid")
    order = np.lexsort((ids, -sim))
    return Candidates(ids[order], sim[order], cut)


def _fillers(ranges, taken: np.ndarray, k: int) -> list[np.ndarray]:
    """The first ``k`` positions of each range that are not in ``taken`` (sorted)."""
    out = []
    for lo, hi in ranges:
        span = np.arange(lo, min(hi, lo + k + len(taken)))
        out.append(span[~np.isin(span, taken, assume_unique=True)][:k])
    return out


def semantic_top_k(c: Candidates, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of sim; past the candidates, the earliest zero-sim messages (exact ties)."""
    if len(c.ids) >= k or len(c.ids) >= c.cut:
        return c.ids[:k], c.sim[:k]
    pad = _fillers([(0, c.cut)], np.sort(c.ids), k - len(c.ids))[0]
    return np.concatenate([c.ids, pad]), np.concatenate([c.sim, np.zeros(len(pad), np.float32)])


def indexed_rank(
    c: Candidates, ts_days: np.ndarray, prediction: WindowPrediction, config: RetrievalConfig, k: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The dual-channel ``(positions, scores)`` over the candidates (see module docstring)."""
    k = config.k if k is None else k
    if not uses_windows(prediction, config):
        return semantic_top_k(c, k)
    inside = channels.id_ranges(ts_days[: c.cut], channels.window_days(prediction.windows))
    core = channels.id_ranges(ts_days[: c.cut], channels.window_days(anchors(prediction)))
    return windowed_rank(c, inside, config, k, core)


def _in_ranges(ids: np.ndarray, ranges) -> np.ndarray:
    out = np.zeros(len(ids), dtype=bool)
    for lo, hi in ranges:
        out |= (ids >= lo) & (ids < hi)
    return out


def windowed_rank(
    c: Candidates,
    inside: list[tuple[int, int]],
    config: RetrievalConfig,
    k: int,
    core: list[tuple[int, int]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``indexed_rank`` for a temporal prediction whose windows hold the position ranges
    ``inside`` and whose anchors hold ``core`` (half-open, merged, within the past; None:
    ``inside``): the backend finds them (bisection here, an indexed time range in a
    database) and this fuses."""
    core = inside if core is None else core
    semantic, _ = semantic_top_k(c, k)
    in_window = _in_ranges(c.ids, inside)
    by_id = np.argsort(c.ids)
    taken, taken_sim = c.ids[by_id], c.sim[by_id]
    # zero-sim fillers: the first of each anchor, then of each window (the exact path's order)
    fillers = [*_fillers(core, taken, k), *_fillers(inside, taken, k)]
    pool = np.unique(np.concatenate([semantic, c.ids[in_window], *fillers]))
    sim = np.zeros(len(pool), dtype=np.float32)
    rank = np.full(len(pool), np.inf)
    at = np.minimum(np.searchsorted(taken, pool), max(len(taken) - 1, 0))
    known = taken[at] == pool if len(taken) else np.zeros(len(pool), dtype=bool)
    sim[known] = taken_sim[at[known]]
    rank[known] = by_id[at[known]] + 1  # its place in the best-first candidate list
    # Past the candidates the exact order is by id: count the non-candidates before each.
    rank[~known] = len(c.ids) + pool[~known] - np.searchsorted(taken, pool[~known]) + 1
    return fuse_ranks(pool, sim, rank, _in_ranges(pool, inside), config.rrf_k, k, _in_ranges(pool, core))
