"""Informative-prompt filtering for GRPO: train only on prompts where the starting policy's
own samples disagree in reward.

GRPO's advantage is relative within a group, so a prompt whose ``num_generations``
completions all earn the same reward contributes no policy gradient, only KL and Adam
noise. After SFT that is about half of the tiny locator's prompts (TRL logs it as
``frac_reward_zero_std``): the ones it already answers right every time, and the ones it
gets wrong every time. DAPO drops such groups online ("dynamic sampling"); TRL 1.16 has
no online filter, so this does it once, before training, with the checkpoint GRPO starts
from: ``filter_samples`` completions per candidate prompt at the training temperature,
scored by the training rewards with the training weights; a prompt is kept when its
weighted rewards are not all equal. Nothing here reads labels the rewards do not read,
and it only ever sees the train split.

The candidates are a seeded sample of ``filter_pool`` distinct train prompts; the
outcome (pool, kept, share per category) is returned for ``prompt_filter.json``.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Sequence

import numpy as np

from tider.train.examples import as_columns

logger = logging.getLogger(__name__)


def reward_scores(reward_fns, completions: Sequence[str], columns: dict) -> dict[str, np.ndarray]:
    """Each reward function's scores for ``completions``, by its registry name."""
    return {
        fn.__name__: np.asarray(fn(prompts=None, completions=list(completions), **columns), dtype=np.float64)
        for fn in reward_fns
    }


def weighted_rewards(reward_fns, weights: Sequence[float], completions: Sequence[str], columns: dict) -> np.ndarray:
    """The composite reward TRL computes: ``sum_i w_i * r_i`` per completion."""
    scores = reward_scores(reward_fns, completions, columns)
    return sum(float(w) * scores[fn.__name__] for fn, w in zip(reward_fns, weights))


def informative_records(
    records: Sequence[dict],
    backend,
    reward_fns,
    weights: Sequence[float],
    *,
    samples: int,
    pool: int,
    temperature: float,
    max_tokens: int,
    seed: int = 0,
    chunk: int = 32,
) -> tuple[list[dict], dict]:
    """``(kept records, report)``: of a seeded sample of ``pool`` records, those whose
    ``samples`` completions from ``backend`` (``generate_batch``) differ in reward."""
    if samples < 2:
        raise ValueError(f"filter_samples must be at least 2 (a reward spread needs two samples), got {samples}")
    candidates = list(records)
    random.Random(seed).shuffle(candidates)
    candidates = candidates[:pool]
    kept, spread = [], []
    per_chunk = max(1, chunk // samples)
    for i in range(0, len(candidates), per_chunk):
        part = candidates[i : i + per_chunk]
        batch = [r["prompt"] for r in part for _ in range(samples)]
        texts = [
            c.text for c in backend.generate_batch(batch, max_tokens=max_tokens, temperature=temperature, seed=seed + i)
        ]
        scores = weighted_rewards(reward_fns, weights, texts, as_columns(part, samples)).reshape(len(part), samples)
        for record, row in zip(part, scores):
            spread.append(float(row.max() - row.min()))
            if spread[-1] > 1e-9:
                kept.append(record)
    if not kept:
        raise ValueError(
            f"prompt filter: none of {len(candidates)} prompts had a reward spread over {samples} samples; "
            "raise temperature or filter_samples, or turn the filter off"
        )
    report = {
        "pool": len(candidates),
        "kept": len(kept),
        "samples": samples,
        "temperature": temperature,
        "kept_share": len(kept) / len(candidates),
        "mean_spread": float(np.mean(spread)),
        "kept_by_category": dict(Counter(r.get("category", "") for r in kept)),
        "pool_by_category": dict(Counter(r.get("category", "") for r in candidates)),
    }
    logger.info(
        "prompt filter: kept %d of %d prompts (%.0f%%) with a reward spread over %d samples",
        len(kept),
        len(candidates),
        100 * report["kept_share"],
        samples,
    )
    return kept, report
