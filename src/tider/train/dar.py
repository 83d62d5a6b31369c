"""Difficulty-aware rollout reweighting (DAR, TIDER Table 8).

Training prompts are resampled by their gold-window-count bucket (``types.window_bucket``)
with factors {0: 10.0, 1: 1.0, 2: 1.0, >=3: 4.0}: non-temporal and multi-window prompts
are rare but are where the switch and multi-window rewards learn. The effective
probability of a bucket is its empirical share times its factor, renormalised — the
numbers the paper's table reports and ``effective_probabilities`` returns for logging.

Resampling (seeded, with replacement) happens once, before the trainer sees the data, so
the dataset TRL shuffles and checkpoints is a plain list and resuming stays exact.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Mapping, Sequence

from tider.types import WINDOW_BUCKETS, window_bucket

logger = logging.getLogger(__name__)

DEFAULT_DAR_FACTORS: dict[str, float] = {"0": 10.0, "1": 1.0, "2": 1.0, ">=3": 4.0}


def _check(factors: Mapping[str, float]) -> dict[str, float]:
    unknown = set(factors) - set(WINDOW_BUCKETS)
    if unknown:
        raise ValueError(f"unknown DAR bucket(s) {sorted(unknown)}; known buckets: {list(WINDOW_BUCKETS)}")
    if any(v < 0 for v in factors.values()):
        raise ValueError(f"DAR factors must be non-negative, got {dict(factors)}")
    return {b: float(factors.get(b, 1.0)) for b in WINDOW_BUCKETS}


def effective_probabilities(
    n_gold_windows: Sequence[int], factors: Mapping[str, float] = DEFAULT_DAR_FACTORS
) -> dict[str, float]:
    """Per-bucket sampling probability after reweighting (sums to 1 over present buckets)."""
    f = _check(factors)
    counts = Counter(window_bucket(n) for n in n_gold_windows)
    mass = {b: counts.get(b, 0) * f[b] for b in WINDOW_BUCKETS}
    total = sum(mass.values())
    if total == 0:
        raise ValueError("DAR: no training prompt has a positive weight")
    return {b: mass[b] / total for b in WINDOW_BUCKETS}


def dar_resample(
    records: Sequence[dict],
    factors: Mapping[str, float] = DEFAULT_DAR_FACTORS,
    *,
    num_samples: int | None = None,
    seed: int = 0,
    count_column: str = "n_gold_windows",
) -> list[dict]:
    """Draw ``num_samples`` (default: as many as given) records with replacement, each with
    probability proportional to its bucket's factor. Logs the effective probabilities."""
    if not records:
        return []
    f = _check(factors)
    counts = [int(r[count_column]) for r in records]
    weights = [f[window_bucket(n)] for n in counts]
    if sum(weights) == 0:
        raise ValueError("DAR: every training prompt has weight 0")
    probs = effective_probabilities(counts, f)
    logger.info("DAR effective probabilities by gold-window bucket: %s", {b: round(p, 3) for b, p in probs.items()})
    rng = random.Random(seed)
    return list(rng.choices(list(records), weights=weights, k=num_samples or len(records)))
