"""Retrieval metrics, McNemar and window IoU on hand-computed cases."""

from __future__ import annotations

import math
from datetime import datetime

import pytest

from tider.eval.metrics import aggregate, query_metrics, switch_f1
from tider.eval.stats import mcnemar_exact, pairwise_mcnemar
from tider.scoring import window_iou
from tider.types import Window


def d(day, hour=0):
    return datetime(2023, 5, day, hour)


def test_query_metrics_hand_values():
    m = query_metrics([7, 3, 9, 1], gold=[3, 1, 42], ks=[1, 2, 4])
    assert m["n_gold"] == 3 and m["rr"] == 0.5
    assert (m["hits@1"], m["hits@2"], m["hits@4"]) == (0, 1, 2)
    assert m["all@4"] == 0
    assert m["ndcg@2"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert m["ndcg@4"] == pytest.approx((1 / math.log2(3) + 1 / math.log2(5)) / ideal)
    assert query_metrics([5, 6], gold=[6, 5], ks=[2])["all@2"] == 1


def test_aggregate_is_micro_over_evidence_units():
    base = {
        "rr": 0.0,
        "iou": 1.0,
        "switch": 1.0,
        "pred_temporal": False,
        "gold_temporal": False,
        "n_windows": 0,
        "ndcg@2": 0.0,
    }
    a = {**base, "n_gold": 1, "hits@2": 1, "all@2": 1}
    b = {**base, "n_gold": 3, "hits@2": 1, "all@2": 0}
    agg = aggregate([a, b], ks=[2])
    assert agg["recall@2"] == pytest.approx(2 / 4)  # micro, not (1 + 1/3) / 2
    assert agg["hit_all@2"] == 0.5 and agg["n"] == 2


def test_switch_f1():
    assert switch_f1([True, True, False, False], [True, False, True, False]) == pytest.approx(0.5)
    assert switch_f1([False], [False]) == 0.0


def test_mcnemar_exact_hand_value():
    a = [True] * 8 + [False] * 2 + [True] * 5
    b = [False] * 8 + [True] * 2 + [True] * 5
    r = mcnemar_exact(a, b)
    assert (r["b"], r["c"]) == (8, 2)
    assert r["p"] == pytest.approx(2 * (45 + 10 + 1) / 1024)  # two-sided binomial, n=10, k>=8
    assert mcnemar_exact([True], [True])["p"] == 1.0
    assert set(pairwise_mcnemar({"x": a, "y": b, "z": a})) == {"x vs y", "x vs z", "y vs z"}


def test_window_iou_hand_cases():
    # day granularity: [1..3] covers 3 days, [2..5] covers 4, overlap 2 -> 2 / 5
    assert window_iou([Window(d(1), d(3))], [Window(d(2), d(5))], "day") == pytest.approx(0.4)
    # hours inside a day floor to the day: same day -> 1.0
    assert window_iou([Window(d(1, 3), d(1, 20))], [Window(d(1), d(1))], "day") == 1.0
    # overlapping predictions are unioned, not double counted
    assert window_iou([Window(d(1), d(2)), Window(d(2), d(3))], [Window(d(1), d(3))], "day") == 1.0
    assert window_iou([], [], "day") == 1.0 and window_iou([], [Window(d(1), d(1))], "day") == 0.0
    # minute granularity: 10:00-10:59 vs 10:30-11:29 -> 30 / 90
    w1 = Window(datetime(2023, 5, 1, 10, 0), datetime(2023, 5, 1, 10, 59))
    w2 = Window(datetime(2023, 5, 1, 10, 30), datetime(2023, 5, 1, 11, 29))
    assert window_iou([w1], [w2], "minute") == pytest.approx(30 / 90)
