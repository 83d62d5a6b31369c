"""Distance-decay rerank (TIDER Sec. 3, Fig. 8 defaults).

For a candidate message m with similarity sim(m) in [0, 1] (see ``channels``) and the
predicted windows W (not widened):

    d(m)     = distance in days from t(m) to the nearest window of W (0 inside one)
    gamma(m) = max(gamma_min, exp(-rho * d(m)))
    score(m) = sim(m) * gamma(m) + lambda_boost * [m inside some window of W]

so in-window evidence is promoted by ``lambda_boost``, nearby messages keep most of their
similarity, and far-away ones keep at least ``gamma_min`` of it (a wrong window cannot
bury a strong semantic match). Defaults: lambda_boost 0.3, gamma_min 0.3, rho 0.05/day.
"""

from __future__ import annotations

import numpy as np


def decay(distance_days: np.ndarray, gamma_min: float, rho_per_day: float) -> np.ndarray:
    return np.maximum(gamma_min, np.exp(-rho_per_day * np.asarray(distance_days, dtype=np.float64)))


def window_distance(ts_days: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Days from each timestamp to the nearest ``[start, end]`` row of ``windows`` (0 inside)."""
    t = np.asarray(ts_days, dtype=np.float64)[:, None]
    gaps = np.maximum(np.maximum(windows[None, :, 0] - t, t - windows[None, :, 1]), 0.0)
    return gaps.min(axis=1)


def rerank_scores(
    sim: np.ndarray, ts_days: np.ndarray, windows: np.ndarray, lambda_boost: float, gamma_min: float, rho_per_day: float
) -> np.ndarray:
    """``score(m)`` from the module docstring for aligned arrays ``sim`` and ``ts_days``."""
    dist = window_distance(ts_days, windows)
    return sim * decay(dist, gamma_min, rho_per_day) + lambda_boost * (dist == 0.0)
