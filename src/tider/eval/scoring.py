"""One scorer, two users: the GRPO rewards and the evaluation metrics both call these
functions, so a reward and the metric it optimises can never drift apart.

Window IoU works on covered time at the dataset's granularity: a window ``[s, e]``
covers the units ``floor(s) .. floor(e)`` inclusive (a one-day window at day
granularity covers one unit). Sets of windows are unioned first, so overlapping
predictions are not double counted.

Non-temporal cases (both sides empty): IoU 1.0 when neither side has windows
(a correct "no time constraint" call), 0.0 when exactly one side is empty.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from tider.types import GRANULARITY_UNIT, Granularity, Window, floor_time


def _covered(windows: Iterable[Window], granularity: Granularity) -> list[tuple[float, float]]:
    """Merged half-open intervals, in units of the granularity, covered by ``windows``."""
    unit = GRANULARITY_UNIT[granularity].total_seconds()
    spans = sorted(
        (floor_time(w.start, granularity).timestamp() / unit, floor_time(w.end, granularity).timestamp() / unit + 1)
        for w in windows
    )
    merged: list[list[float]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(hi - lo for lo, hi in intervals)


def _intersection(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def window_iou(pred: Iterable[Window], gold: Iterable[Window], granularity: Granularity) -> float:
    """Jaccard of the time covered by ``pred`` and by ``gold`` (see module docstring)."""
    p, g = _covered(pred, granularity), _covered(gold, granularity)
    if not p and not g:
        return 1.0
    if not p or not g:
        return 0.0
    inter = _intersection(p, g)
    return inter / (_length(p) + _length(g) - inter)


def switch_correct(pred_temporal: bool, gold_temporal: bool) -> float:
    """1.0 when the temporal/non-temporal switch matches the gold label."""
    return float(bool(pred_temporal) == bool(gold_temporal))


def evidence_coverage(retrieved_ids: Sequence[int], gold_ids: Iterable[int], k: int) -> float:
    """Fraction of gold evidence ids found in the top-``k`` retrieved ids.

    Queries without gold evidence score 0.0 (nothing to cover); callers that average
    over queries should skip them, as the retrieval report does.
    """
    gold = set(gold_ids)
    if not gold:
        return 0.0
    return len(gold.intersection(retrieved_ids[:k])) / len(gold)
