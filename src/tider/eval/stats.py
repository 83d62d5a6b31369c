"""Paired significance: exact McNemar test (TIDER Table 15 style: b, c, p), and the paired
bootstrap of a mean difference (GRPO - SFT on the same questions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

import numpy as np


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> dict:
    """Exact two-sided McNemar on paired binary outcomes.

    ``b``: pairs where the first system succeeds and the second fails; ``c``: the reverse.
    p = two-sided binomial test of b successes in b + c trials at 0.5 (1.0 when b + c = 0).
    """
    from scipy.stats import binomtest

    if len(a) != len(b):
        raise ValueError(f"paired outcomes differ in length: {len(a)} vs {len(b)}")
    n01 = sum(1 for x, y in zip(a, b) if x and not y)
    n10 = sum(1 for x, y in zip(a, b) if y and not x)
    p = binomtest(n01, n01 + n10, 0.5).pvalue if n01 + n10 else 1.0
    return {"b": n01, "c": n10, "p": float(p), "n": len(a)}


def pairwise_mcnemar(outcomes: Mapping[str, Sequence[bool]]) -> dict[str, dict]:
    """McNemar for every pair of systems; keys ``"A vs B"``. Outcome lists must be aligned."""
    return {
        f"{x} vs {y}": {"a": x, "b_system": y, **mcnemar_exact(outcomes[x], outcomes[y])}
        for x, y in combinations(list(outcomes), 2)
    }


def mcnemar_markdown(title: str, first_column: str, tests: Mapping[str, dict], orientation: str) -> list[str]:
    """A report section: ``title``, what b and c mean (``orientation``), one row per test."""
    if not tests:
        return []
    lines = ["", f"## {title}", "", orientation, "", f"| {first_column} | b | c | p |", "|---|---|---|---|"]
    return lines + [f"| {name} | {v['b']} | {v['c']} | {v['p']:.3g} |" for name, v in tests.items()]


def paired_bootstrap_ci(diffs, n_boot: int = 10_000, seed: int = 0, alpha: float = 0.05) -> dict:
    """Mean of the paired differences ``diffs`` and its percentile bootstrap ``1 - alpha``
    interval (``n_boot`` resamples of the pairs, seeded): ``{"mean", "ci_low", "ci_high", "n"}``."""
    diffs = np.asarray(diffs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(n_boot, len(diffs)))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return {"mean": float(diffs.mean()), "ci_low": float(lo), "ci_high": float(hi), "n": len(diffs)}
