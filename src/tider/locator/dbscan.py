"""T-Mem Temporal Evidence Discovery as a window source (T-Mem Sec. 4.2, App. C).

1. Seeds: BM25 top-``seeds`` messages (metadata-expanded index) for the query text with
   the asking user's name appended ("Queries combine the asking-user identifier with
   the question").
2. Per topic (messages without topic metadata form one topic), cluster the seed
   timestamps with scikit-learn ``DBSCAN(eps, min_samples=minPts)`` on a 1-D time axis.
3. Density rho(C) = |C| / max(span(C), delta); keep clusters with rho(C) > mu.
4. Each kept cluster's ``[first, last]`` seed time, padded by ``pad`` on both sides, is a
   window; overlapping windows are merged. No surviving cluster -> non-temporal
   prediction (the query takes the semantic path, as T-Mem does without expansion).

``dbscan-paper``: the paper's values converted to days (eps 12 h, minPts 2, delta 2 h,
mu 0.25/h = 6/day, pad 12 h). On LoCoMo every turn of a session shares one timestamp,
so any two seeds from one session form a zero-span cluster of density |C|/delta, and the
rule keeps almost every such session.
``dbscan-tuned``: same rule, parameters chosen by ``bench/sweep_dbscan.py`` (grid over
eps, mu, delta, pad and ``max_windows`` = keep only the densest clusters) on the
non-test conversations of the dev file only (values and their source in ``TUNED``).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np

from tider.locator.sources import BaseSource, register_source
from tider.retrieval.channels import EPOCH, to_days
from tider.retrieval.config import DBSCANConfig
from tider.scoring import merge_intervals
from tider.types import NON_TEMPORAL, Query, Window, WindowPrediction

PAPER = DBSCANConfig()  # DBSCANConfig defaults are the paper's values in days
# Chosen by `python bench/sweep_dbscan.py` on LoCoMo dev, non-test conversations only (883
# questions; conv-47 held out): best recall@20 among 192 settings that emit windows for at
# least half the questions: eps 7 days, mu 0.25 per day, no padding (paper delta 2 h kept)
# -> recall@20 0.537 / hit_all@20 0.595 vs paper rule 0.523 / 0.576 and no windows
# 0.543 / 0.591. Keeping only the densest 1-3 clusters (max_windows) scored lower.
# See README "Retrieval" and runs/sweep_dbscan.json.
TUNED = replace(PAPER, eps_days=7.0, mu_per_day=0.25, pad_days=0.0)


def dbscan_windows(
    seed_days: np.ndarray, seed_topics: list, config: DBSCANConfig
) -> list[tuple[float, float, float, int]]:
    """``(start_day, end_day, density, size)`` of every kept cluster, densest first."""
    from sklearn.cluster import DBSCAN

    kept = []
    for topic in dict.fromkeys(seed_topics):
        times = np.array([t for t, tp in zip(seed_days, seed_topics) if tp == topic], dtype=np.float64)
        if len(times) < config.min_pts:
            continue
        labels = DBSCAN(eps=config.eps_days, min_samples=config.min_pts).fit(times.reshape(-1, 1)).labels_
        for label in sorted(set(labels.tolist()) - {-1}):
            members = times[labels == label]
            lo, hi = float(members.min()), float(members.max())
            density = len(members) / max(hi - lo, config.delta_days)
            if density > config.mu_per_day:
                kept.append((lo, hi, density, len(members)))
    kept.sort(key=lambda c: (-c[2], -c[3], c[0]))
    return kept


def _from_days(d: float):
    # Round to the microsecond so a window edge equal to a message time contains it.
    return EPOCH + timedelta(microseconds=round(d * 86400e6))


class DBSCANWindows(BaseSource):
    """Reads the store's BM25 ranking of the query (with the asking user's name)."""

    def __init__(self, config: DBSCANConfig, name: str):
        self.config, self.name = config, name

    def seeds(self, query: Query, store) -> np.ndarray:
        """BM25 top-``seeds`` among the messages said by ``asked_at`` (no memory from the future)."""
        text = f"{query.text} {query.user}" if query.user else query.text
        ranked = store.ranking(replace(query, text=text), mode="bm25")
        ids = ranked.ids[: self.config.seeds]
        return ids[ranked.sim[: self.config.seeds] > 0]  # a message sharing no term with the query is not an anchor

    def predict(self, query: Query, store) -> WindowPrediction:
        memory = store.messages(query.memory_key)
        ids = self.seeds(query, store)
        days = np.array([to_days(memory.timestamps[i]) for i in ids], dtype=np.float64)
        topics = [memory[i].topic for i in ids]
        clusters = dbscan_windows(days, topics, self.config)
        if self.config.max_windows is not None:
            clusters = clusters[: self.config.max_windows]
        if not clusters:
            return NON_TEMPORAL
        pad = self.config.pad_days
        spans = merge_intervals([(lo - pad, hi + pad) for lo, hi, _, _ in clusters])
        return WindowPrediction(temporal=True, windows=tuple(Window(_from_days(a), _from_days(b)) for a, b in spans))


@register_source("dbscan-paper")
def dbscan_paper() -> DBSCANWindows:
    return DBSCANWindows(PAPER, "dbscan-paper")


@register_source("dbscan-tuned")
def dbscan_tuned() -> DBSCANWindows:
    return DBSCANWindows(TUNED, "dbscan-tuned")


@register_source("dbscan")
def dbscan_custom(**params) -> DBSCANWindows:
    """Any parameters, e.g. ``make_source("dbscan", eps_days=1, max_windows=3)``."""
    return DBSCANWindows(replace(PAPER, **params), "dbscan")
