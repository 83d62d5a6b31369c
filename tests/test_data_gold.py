import itertools
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tider.data import gold_windows
from tider.data.gold import unit_window
from tider.scoring import window_iou
from tider.types import Memory, Message, Window


def ts(day, hour=12, minute=0, month=5):
    return datetime(2023, month, day, hour, minute)


def test_same_day_evidence_is_one_whole_day_window():
    temporal, windows = gold_windows([ts(8, 13, 56), ts(8, 9, 1)], "day")
    assert temporal is True
    assert windows == (Window(datetime(2023, 5, 8), datetime(2023, 5, 8, 23, 59, 59, 999999)),)
    assert windows[0].to_json("day") == {"start": "2023-05-08", "end": "2023-05-08"}


def test_consecutive_days_merge_by_default_and_gaps_split():
    _, windows = gold_windows([ts(8), ts(9), ts(12)], "day")
    assert [w.to_json("day") for w in windows] == [
        {"start": "2023-05-08", "end": "2023-05-09"},
        {"start": "2023-05-12", "end": "2023-05-12"},
    ]


def test_merge_gap_is_configurable():
    days = [ts(8), ts(9), ts(12)]
    assert len(gold_windows(days, "day", merge_gap=timedelta(0))[1]) == 3
    assert len(gold_windows(days, "day", merge_gap=timedelta(days=3))[1]) == 1
    with pytest.raises(ValueError, match="merge_gap"):
        gold_windows(days, "day", merge_gap=timedelta(days=-1))


def test_non_temporal_rules():
    assert gold_windows([], "day") == (False, ())
    assert gold_windows([ts(8)], "day", non_temporal=True) == (False, ())
    spread = [ts(1), ts(10), ts(20)]
    assert gold_windows(spread, "day", max_windows=2) == (False, ())
    assert gold_windows(spread, "day", max_windows=3)[0] is True


def test_minute_granularity_merges_within_an_hour():
    _, windows = gold_windows([ts(8, 10, 0), ts(8, 10, 50), ts(8, 13, 0)], "minute")
    assert [w.to_json("minute") for w in windows] == [
        {"start": "2023-05-08T10:00", "end": "2023-05-08T10:50"},
        {"start": "2023-05-08T13:00", "end": "2023-05-08T13:00"},
    ]
    with pytest.raises(ValueError, match="granularity"):
        gold_windows([ts(8)], "hour")


def test_gold_window_selects_every_message_of_its_days():
    msgs = [Message(i, f"m{i}", "x", t, "a", "s") for i, t in enumerate([ts(7, 23), ts(8, 0), ts(8, 23, 59), ts(9, 0)])]
    memory = Memory("m", msgs)
    _, (window,) = gold_windows([ts(8, 12)], "day")
    assert memory.id_range(window) == (1, 3)
    # A window scores IoU 1 against itself written as plain dates, as the locator writes it.
    assert window_iou([Window(datetime(2023, 5, 8), datetime(2023, 5, 8))], [window], "day") == 1.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=400 * 24 * 60), min_size=1, max_size=30),
    st.sampled_from(["day", "minute"]),
    st.integers(min_value=0, max_value=5),
)
def test_windows_cover_all_evidence_disjoint_and_sorted(minutes, granularity, gap_units):
    base = datetime(2022, 1, 1)
    stamps = [base + timedelta(minutes=m) for m in minutes]
    unit = timedelta(days=1) if granularity == "day" else timedelta(minutes=1)
    temporal, windows = gold_windows(stamps, granularity, merge_gap=gap_units * unit)
    assert temporal
    assert all(any(w.contains(t) for w in windows) for t in stamps)
    for a, b in itertools.pairwise(windows):
        assert b.start - a.end > gap_units * unit - timedelta(microseconds=1) and a.end < b.start
    assert windows[0] == unit_window(min(stamps), windows[0].end, granularity)
