"""Read a locator completion back into a ``WindowPrediction`` — or a typed failure.

Windows are ``{"mark": "H1"}`` (the line carrying that mark), ``{"option": n}`` (the
learning-free answer listed as option n: its windows, exactly), ``{"entry": k}`` /
``{"cue": j}`` references into the prompt's table (``tider.locator.prompt.LocatorInput``:
line spans and cue ranges, 1-based) or explicit ``{"start", "end"}``; ``refs`` carries
that table. A reference past the table is
``BAD_REFERENCE``; a referenced span covers its whole first and last unit, like a date.

The parser never raises: a GRPO reward must score a malformed completion 0 and count
why, not crash the trainer. Failure reasons are a ``str`` Enum so they log as plain text.

Accepted input: an optional ``<think>...</think>`` block, then the first JSON object in
the text (leading prose or code fences are tolerated; the first object that decodes wins).

Day granularity: ``{"start": "2023-05-01", "end": "2023-05-03"}`` means the whole of
May 1-3, so ``end`` is moved to the last instant of its day (23:59:59.999999). A retriever
slicing ``Memory.id_range`` then keeps afternoon messages of the last day; the scorers
floor to the granularity, so IoU is unchanged. Minute granularity works the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

import jsonschema
from dateutil.parser import isoparse

from tider.locator.contract import MAX_WINDOWS, OUTPUT_SCHEMA
from tider.types import GRANULARITY_UNIT, Granularity, Window, WindowPrediction, floor_time


class ParseFailure(str, Enum):
    NO_JSON = "no_json"
    SCHEMA = "schema"
    BAD_DATE = "bad_date"
    START_AFTER_END = "start_after_end"
    OUTSIDE_MEMORY = "outside_memory"
    TOO_MANY_WINDOWS = "too_many_windows"
    BAD_REFERENCE = "bad_reference"


@dataclass(frozen=True)
class Refs:
    """What ``{"entry": k}``, ``{"cue": j}`` and ``{"mark": label}`` point at: line spans,
    cue ranges, and (label, line number) pairs."""

    lines: tuple[Window, ...] = ()
    cues: tuple[Window, ...] = ()
    marks: tuple[tuple[str, int], ...] = ()
    options: tuple[tuple[Window, ...], ...] = ()

    @classmethod
    def of(cls, obj) -> Refs:
        """From a ``LocatorInput``, a ``Refs``, a dict or its JSON string (a GRPO column)."""
        if obj is None or isinstance(obj, Refs):
            return obj or cls()
        if isinstance(obj, str):
            obj = json.loads(obj) if obj else {}
        if isinstance(obj, dict):

            def window(row):  # [start, end] or [start, end, core start, core end]
                ends = [isoparse(t) for t in row]
                return Window(ends[0], ends[1], Window(ends[2], ends[3]) if len(ends) == 4 else None)

            def windows(rows):
                return tuple(window(r) for r in rows)

            marks = tuple((str(m), int(k)) for m, k in obj.get("marks", {}).items())
            options = tuple(windows(o) for o in obj.get("options", ()))
            return cls(windows(obj.get("lines", ())), windows(obj.get("cues", ())), marks, options)
        return cls(
            tuple(obj.lines), tuple(obj.cues), tuple(getattr(obj, "marks", ())), tuple(getattr(obj, "options", ()))
        )


@dataclass(frozen=True)
class ParseResult:
    prediction: WindowPrediction | None
    failure: ParseFailure | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.prediction is not None


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
# The schema without its maxItems: too many windows is its own, more useful, failure. Mark
# references are part of the shape; whether this table has the label is checked below.
_SHAPE_SCHEMA = json.loads(json.dumps(OUTPUT_SCHEMA))
_SHAPE_SCHEMA["properties"]["windows"].pop("maxItems", None)  # (references are checked against the table below)
_VALIDATOR = jsonschema.Draft202012Validator(_SHAPE_SCHEMA)


def _first_json_object(text: str) -> object | None:
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def _parse_time(value: str, granularity: Granularity) -> datetime:
    ts = isoparse(value)
    if ts.tzinfo is not None:  # the data model is naive UTC
        ts = (ts - ts.utcoffset()).replace(tzinfo=None)
    return floor_time(ts, granularity)


def _end_of_unit(ts: datetime, granularity: Granularity) -> datetime:
    return floor_time(ts, granularity) + GRANULARITY_UNIT[granularity] - timedelta(microseconds=1)


def _windows(raw: dict, refs: Refs, granularity: Granularity) -> tuple[tuple[Window, ...], ParseResult | None]:
    """One raw window -> (windows, None) or ((), failure): an option stands for its rule's
    windows, exactly as the rule answers them; every other reference for one window."""
    if "option" in raw:
        n = raw["option"]
        if not 1 <= n <= len(refs.options) or not refs.options[n - 1]:
            return (), ParseResult(None, ParseFailure.BAD_REFERENCE, f"option {n} is not listed in the prompt")
        return refs.options[n - 1], None
    window, failure = _window(raw, refs, granularity)
    return ((window,) if window is not None else ()), failure


def _window(raw: dict, refs: Refs, granularity: Granularity) -> tuple[Window | None, ParseResult | None]:
    """One raw window -> (window, None) or (None, failure)."""
    if "mark" in raw:
        k = dict(refs.marks).get(raw["mark"])
        if k is None or not 1 <= k <= len(refs.lines):
            return None, ParseResult(
                None, ParseFailure.BAD_REFERENCE, f"mark {raw['mark']!r} is on no line of the prompt"
            )
        raw = {"entry": k}
    for name, table in (("entry", refs.lines), ("cue", refs.cues)):
        if name in raw:
            k = raw[name]
            if not 1 <= k <= len(table):
                return None, ParseResult(None, ParseFailure.BAD_REFERENCE, f"{name} {k} not in 1..{len(table)}")
            w = table[k - 1]
            return Window(floor_time(w.start, granularity), _end_of_unit(w.end, granularity)), None
    try:
        start, end = _parse_time(raw["start"], granularity), _parse_time(raw["end"], granularity)
    except (ValueError, OverflowError) as exc:
        return None, ParseResult(None, ParseFailure.BAD_DATE, f"{raw!r}: {exc}")
    if start > end:
        return None, ParseResult(None, ParseFailure.START_AFTER_END, f"{raw['start']} > {raw['end']}")
    return Window(start, _end_of_unit(end, granularity)), None


def parse_prediction(
    text: str,
    *,
    granularity: Granularity,
    refs=None,
    memory_span: Window | None = None,
    max_windows: int = MAX_WINDOWS,
) -> ParseResult:
    """Parse a completion. ``refs`` (a ``LocatorInput``, ``Refs`` or its JSON) resolves
    references; ``memory_span`` (``Memory.span``) enables the outside-memory check: a
    window that does not overlap the memory's span at all is a failure."""
    if not isinstance(text, str):
        return ParseResult(None, ParseFailure.NO_JSON, f"completion is {type(text).__name__}, not text")
    body = _THINK.sub("", text)
    if "<think>" in body:  # an unclosed think block: the answer never came
        return ParseResult(None, ParseFailure.NO_JSON, "unclosed <think> block")
    obj = _first_json_object(body)
    if obj is None:
        return ParseResult(None, ParseFailure.NO_JSON, "no JSON object in completion")
    error = next(iter(_VALIDATOR.iter_errors(obj)), None)
    if error is not None:
        return ParseResult(None, ParseFailure.SCHEMA, error.message)
    temporal, raw_windows = obj["temporal"], obj["windows"]
    if not temporal:
        if raw_windows:
            return ParseResult(None, ParseFailure.SCHEMA, "temporal is false but windows are given")
        return ParseResult(WindowPrediction(temporal=False, windows=()))
    if not raw_windows:
        return ParseResult(None, ParseFailure.SCHEMA, "temporal is true but no window is given")
    if len(raw_windows) > max_windows:
        return ParseResult(None, ParseFailure.TOO_MANY_WINDOWS, f"{len(raw_windows)} windows > {max_windows}")
    table = Refs.of(refs)
    windows = []
    for raw in raw_windows:
        found, failure = _windows(raw, table, granularity)
        if failure is not None:
            return failure
        for window in found:
            if memory_span is not None:
                lo = floor_time(memory_span.start, granularity)
                hi = _end_of_unit(memory_span.end, granularity)
                if window.end < lo or window.start > hi:
                    return ParseResult(None, ParseFailure.OUTSIDE_MEMORY, f"{raw!r} outside memory span")
            windows.append(window)
    return ParseResult(WindowPrediction(temporal=True, windows=tuple(sorted(set(windows)))))
