"""Reading Recognizers-Text results into day ranges (``tider.locator.rules`` runs the
library and caches what this module makes of its results): which year a year-less date
means, open ranges closed by the memory and ``asked_at``, and spans anchored to a time
("the week before August 3") composed into the days the words name. The rules are listed
in ``tider.locator.rules``' docstring.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from tider.types import Window

DAY = timedelta(days=1)
# Recognizers-Text result types that resolve to calendar time; durations ("for two
# weeks"), sets ("every Monday") and bare times of day say nothing about which days.
DATED_TYPES = {"date", "daterange", "datetime", "datetimerange"}
# A bare period: the library resolves it to the current one unless something anchors it.
_BARE_PERIOD = re.compile(r"^(?:the|that)\s+(day|week|weekend|month|year)$", re.IGNORECASE)
_ANCHORED_AFTER = re.compile(r"^\s*(?:of|before|after|following|preceding)\b", re.IGNORECASE)
# "the day before May 3": the library returns May 3 and drops the offset.
_DAY_OFFSET = re.compile(r"^the\s+day\s+(before|after)\s", re.IGNORECASE)
_PERIOD_DAYS = {"day": 1, "week": 7}


@dataclass(frozen=True)
class TimeCue:
    """One resolved time expression: the words as written and the closed day range."""

    text: str
    window: Window

    def clip(self, lo: datetime, hi: datetime) -> TimeCue | None:
        """This cue restricted to ``[lo, hi]``; None when it lies wholly outside."""
        start, end = max(self.window.start, lo), min(self.window.end, hi)
        return TimeCue(self.text, Window(start, end)) if start <= end else None


def start_of_day(ts: datetime) -> datetime:
    return ts.replace(hour=0, minute=0, second=0, microsecond=0)


def end_of_day(ts: datetime) -> datetime:
    return start_of_day(ts) + DAY - timedelta(microseconds=1)


def _parse_stamp(value) -> datetime | None:
    if not value or not isinstance(value, str) or value == "not resolved":
        return None
    try:
        return datetime.fromisoformat(value.strip())
    except ValueError:
        return None


def _candidate(value: dict, kind: str, floor: datetime, asked_at: datetime) -> Window | None:
    """One resolution value -> a closed day window (open ends closed by floor/asked_at)."""
    timex = str(value.get("timex", ""))
    if "REF" in timex:  # PAST_REF / PRESENT_REF / FUTURE_REF: "recently", "now" - vague
        return None
    if kind in ("date", "datetime"):
        point = _parse_stamp(value.get("value"))
        return Window(start_of_day(point), end_of_day(point)) if point else None
    start, end = _parse_stamp(value.get("start")), _parse_stamp(value.get("end"))
    if start is None and end is None:
        return None
    start = start_of_day(start) if start else start_of_day(floor)
    # Ranges come back half-open ("2023-05-01" .. "2023-05-08" for a week); a missing end
    # is an open range ("since March") that runs to the question.
    end = end_of_day(end - DAY) if end is not None and kind == "daterange" else (end or end_of_day(asked_at))
    return Window(start, end) if start <= end else None


@dataclass(frozen=True)
class Found:
    """One library result: its words, where they stand in the question (``end``
    inclusive), its type and its readings."""

    text: str
    start: int
    end: int
    kind: str
    values: tuple

    @classmethod
    def of(cls, result) -> Found:
        return cls(
            " ".join(str(result.text).split()),
            int(result.start),
            int(result.end),
            str(result.type_name).rsplit(".", 1)[-1],
            tuple((result.resolution or {}).get("values", [])),
        )


def readings(found: Found, floor: datetime, asked_at: datetime) -> list[Window]:
    """The day windows of one result's readings ("the day before May 3": shifted a day)."""
    windows = [w for w in (_candidate(v, found.kind, floor, asked_at) for v in found.values) if w is not None]
    offset = _DAY_OFFSET.match(found.text)
    if offset and found.kind == "date":
        shift = -DAY if offset.group(1).lower() == "before" else DAY
        windows = [Window(w.start + shift, w.end + shift) for w in windows]
    return windows


def event_anchored(found: Found, question: str) -> bool:
    """A bare period followed by "of / before / after ..." that the library did not read
    ("the week of the merger"): it names a period next to an event, not the current one."""
    return bool(_BARE_PERIOD.match(found.text)) and bool(_ANCHORED_AFTER.match(question[found.end + 1 :]))


def _offset_span(mod: str, edge: datetime, period: str | None, days: int) -> Window:
    """The span a period or a count of days names next to an anchor. ``edge`` is the first
    day after the span ("before") or the first day it may start ("after")."""
    from dateutil.relativedelta import relativedelta

    if period == "weekend":  # the Saturday-Sunday next to the anchor
        if mod == "before":
            last = edge - DAY
            sunday = last - timedelta(days=(last.weekday() + 1) % 7)
            return Window(sunday - DAY, end_of_day(sunday))
        saturday = edge + timedelta(days=(5 - edge.weekday()) % 7)
        return Window(saturday, end_of_day(saturday + DAY))
    if period is not None:
        length = (
            relativedelta(days=_PERIOD_DAYS[period]) if period in _PERIOD_DAYS else relativedelta(**{period + "s": 1})
        )
        if mod == "before":
            return Window(edge - length, end_of_day(edge - DAY))
        return Window(edge, end_of_day(edge + length - DAY))
    day = edge - timedelta(days=days) if mod == "before" else edge + timedelta(days=days) - DAY
    return Window(day, end_of_day(day))


def compose(here: Found, anchor: Found | None, question: str) -> list[Window]:
    """``here`` + ``anchor`` as one span when ``here`` is a bare period or a count of days
    standing right before a "before X" / "after X" result ("the week before August 3"):
    one window per reading of the anchor, none when they do not compose."""
    if anchor is None or question[here.end + 1 : anchor.start].strip():
        return []
    bare = _BARE_PERIOD.match(here.text)
    days = 0
    if not bare:
        seconds = float(here.values[0].get("value", 0)) if here.kind == "duration" and here.values else 0.0
        days = round(seconds / 86400)
        if days < 1:
            return []
    out = []
    for v in anchor.values:
        mod, point = v.get("Mod"), v.get("sourceEntity") == "datetimepoint"
        edge = _parse_stamp(v.get("end") if mod == "before" else v.get("start") if mod == "after" else None)
        if edge is not None:
            edge = start_of_day(edge) + (DAY if mod == "after" and point else timedelta(0))
            out.append(_offset_span(mod, edge, bare.group(1).lower() if bare else None, days))
    return out
