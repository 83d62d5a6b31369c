"""T-Mem DBSCAN windows on hand-built seed timestamps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tider.locator.dbscan import PAPER, TUNED, dbscan_windows
from tider.retrieval.config import DBSCANConfig


def test_paper_values_are_converted_to_days():
    assert (PAPER.seeds, PAPER.min_pts) == (36, 2)
    assert PAPER.eps_days * 24 == pytest.approx(12)
    assert PAPER.delta_days * 24 == pytest.approx(2)
    assert PAPER.mu_per_day / 24 == pytest.approx(0.25)
    assert PAPER.pad_days * 24 == pytest.approx(12)
    assert PAPER.max_windows is None  # the paper keeps every cluster above mu
    # The rule reads them in days: three seeds 5.5 h apart form one cluster (eps 12 h,
    # density 3 / 11 h = 6.5 per day > mu = 6), three seeds 13 h apart are noise.
    hours = lambda *h: np.array(h) / 24
    assert [
        (n, round(lo * 24, 6), round(hi * 24, 6))
        for lo, hi, _, n in dbscan_windows(hours(0, 5.5, 11), [None] * 3, PAPER)
    ] == [(3, 0.0, 11.0)]
    assert dbscan_windows(hours(0, 13, 26), [None] * 3, PAPER) == []


def test_tuned_values_are_the_sweep_result():
    """``TUNED`` is the setting ``bench/sweep_dbscan.py`` chose on LoCoMo dev (non-test
    conversations): eps 7 days, mu 0.25 per day, no padding; the rest stays the paper's."""
    assert (TUNED.eps_days, TUNED.mu_per_day, TUNED.pad_days) == (7.0, 0.25, 0.0)
    assert replace(TUNED, eps_days=PAPER.eps_days, mu_per_day=PAPER.mu_per_day, pad_days=PAPER.pad_days) == PAPER


def test_dense_clusters_kept_densest_first_and_noise_dropped():
    days = np.array([0.0, 0.1, 0.2, 10.0, 30.0, 30.05])
    kept = dbscan_windows(days, [None] * 6, DBSCANConfig())
    # {30, 30.05}: span below delta -> 2 / (2/24) = 24 per day; {0..0.2}: 3 / 0.2 = 15; {10}: noise
    assert [(lo, hi, n) for lo, hi, _, n in kept] == [(30.0, 30.05, 2), (0.0, 0.2, 3)]
    assert kept[0][2] == pytest.approx(24.0) and kept[1][2] == pytest.approx(15.0)


@pytest.mark.parametrize("days", [[0.0, 0.4, 0.8], [0.0, 5.0, 10.0], []])
def test_no_surviving_cluster(days):
    # [0, .4, .8]: one cluster, density 3 / 0.8 = 3.75 <= mu = 6; [0, 5, 10]: all noise
    assert dbscan_windows(np.array(days), [None] * len(days), DBSCANConfig()) == []


def test_clustering_is_per_topic():
    days = np.array([0.0, 0.1, 0.0, 0.1])
    assert len(dbscan_windows(days, ["a", "b", "a", "b"], DBSCANConfig())) == 2
    assert dbscan_windows(days[:2], ["a", "b"], DBSCANConfig()) == []  # one seed per topic: no cluster


def test_same_timestamp_pairs_are_infinitely_dense_without_delta_floor():
    # LoCoMo pitfall: every turn of a session shares one timestamp; delta bounds the density.
    days = np.array([3.0, 3.0, 3.0])
    kept = dbscan_windows(days, [None] * 3, replace(DBSCANConfig(), delta_days=1.0, mu_per_day=0.25))
    assert kept == [(3.0, 3.0, 3.0, 3)]
