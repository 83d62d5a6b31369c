"""Gold windows and the temporal switch label, derived from evidence timestamps.

One rule for every loader (LoCoMo, LongMemEval, JSONL, synthetic):

1. Each evidence timestamp is floored to the dataset's granularity (day or minute).
2. Floored times are sorted and merged into one window while the gap between neighbours
   is at most ``merge_gap`` (default: 1 day at day granularity, so evidence on
   consecutive days forms one window; 60 minutes at minute granularity).
3. A window covers whole units: ``[floor(first), end of the last unit]``, e.g. a one-day
   window is ``[2023-05-08 00:00, 2023-05-08 23:59:59.999999]``. So ``Window.contains``
   and ``Memory.id_range`` include every message of that day, and ``to_json`` prints the
   same date twice.
4. ``temporal`` is False (and there are no windows) when
   - there is no resolvable evidence (nothing to localize), or
   - the caller marks the query non-temporal (``non_temporal=True``: synthetic
     non-temporal facts, JSONL ``"temporal": false``, LoCoMo categories listed in the
     loader option ``non_temporal_categories``), or
   - the evidence is too spread to localize: more than ``max_windows`` windows
     (default None = no limit).
   Otherwise ``temporal`` is True.

For LoCoMo the default keeps category 5 (adversarial) temporal: its evidence is real
dialogue that a reader must see to reject the false premise. Pass
``non_temporal_categories=("5",)`` to the loader to switch it off.

Gold labels are evaluation-only: they live in ``Query.gold`` and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from tider.scoring import merge_intervals
from tider.types import GRANULARITY_UNIT, Granularity, Window, floor_time

DEFAULT_MERGE_GAP: dict[str, timedelta] = {"day": timedelta(days=1), "minute": timedelta(minutes=60)}


def unit_window(first: datetime, last: datetime, granularity: Granularity) -> Window:
    """The window covering the whole units from ``first``'s unit to ``last``'s unit."""
    end = floor_time(last, granularity) + GRANULARITY_UNIT[granularity] - timedelta(microseconds=1)
    return Window(floor_time(first, granularity), end)


def gold_windows(
    evidence_timestamps: Iterable[datetime],
    granularity: Granularity,
    merge_gap: timedelta | None = None,
    max_windows: int | None = None,
    non_temporal: bool = False,
) -> tuple[bool, tuple[Window, ...]]:
    """``(temporal, windows)`` for one query; see the module docstring for the rule."""
    if granularity not in GRANULARITY_UNIT:
        raise ValueError(f"unknown granularity {granularity!r}; known: {sorted(GRANULARITY_UNIT)}")
    gap = DEFAULT_MERGE_GAP[granularity] if merge_gap is None else merge_gap
    if gap < timedelta(0):
        raise ValueError(f"merge_gap must be >= 0, got {gap}")
    units = sorted({floor_time(ts, granularity) for ts in evidence_timestamps})
    if non_temporal or not units:
        return False, ()
    groups = merge_intervals(((unit, unit) for unit in units), gap=gap)
    if max_windows is not None and len(groups) > max_windows:
        return False, ()
    return True, tuple(unit_window(first, last, granularity) for first, last in groups)
