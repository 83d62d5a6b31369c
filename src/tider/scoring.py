"""The scorers evaluation and training share: interval arithmetic, window IoU, switch,
evidence coverage and answer F1.


One scorer, two users (docs/design.md, decision 3): the GRPO rewards (``tider.train.rewards``) and
the evaluation metrics (``tider.eval``) call these functions, so a reward and the metric
it optimises can never drift apart. This module depends on the data model only; the
retriever and the gold-window rule use its ``merge_intervals`` as well.

Window IoU works on covered time at the dataset's granularity: a window ``[s, e]``
covers the units ``floor(s) .. floor(e)`` inclusive (a one-day window at day
granularity covers one unit). Sets of windows are unioned first, so overlapping
predictions are not double counted.

Non-temporal cases (both sides empty): IoU 1.0 when neither side has windows
(a correct "no time constraint" call), 0.0 when exactly one side is empty.

Answers are scored by LoCoMo-style token F1 (``answer_f1``), which the QA evaluation
reports and the ``answer_correct`` / ``answer_span`` rewards optimise:

- normalise: lower case, drop punctuation and the articles a/an/the, collapse spaces
  (LoCoMo also Porter-stems tokens; we do not, to avoid an NLTK dependency, so our F1
  is slightly stricter on inflections);
- multi-hop (category "1"/"multi-hop"): the gold answer is split on commas into parts;
  each part takes its best F1 against the comma-split prediction parts; the mean counts;
- adversarial (category "5"/"adversarial"): 1.0 when the prediction abstains (contains
  one of ``ABSTENTION_PHRASES``), else 0.0.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from tider.types import GRANULARITY_UNIT, Granularity, Window, floor_time

T = TypeVar("T")


def merge_intervals(spans: Iterable[tuple[T, T]], gap: Any = None) -> list[tuple[T, T]]:
    """Sort ``(lo, hi)`` spans and merge those that overlap or touch (``lo <= previous hi``),
    or, with ``gap``, that start at most ``gap`` after the previous one ends. Works for any
    ordered values: ints (id ranges), floats (days, units), datetimes (with a timedelta gap)."""
    merged: list[list] = []
    for lo, hi in sorted(spans):
        if merged and (lo <= merged[-1][1] or (gap is not None and lo - merged[-1][1] <= gap)):
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def unit_span(window: Window, granularity: Granularity) -> tuple[float, float]:
    """Half-open ``[first unit, last unit + 1)`` covered by ``window``, in granularity units."""
    unit = GRANULARITY_UNIT[granularity].total_seconds()
    return (
        floor_time(window.start, granularity).timestamp() / unit,
        floor_time(window.end, granularity).timestamp() / unit + 1,
    )


def covered_units(windows: Iterable[Window], granularity: Granularity) -> list[tuple[float, float]]:
    """Merged half-open intervals, in units of the granularity, covered by ``windows``."""
    return merge_intervals(unit_span(w, granularity) for w in windows)


def total_length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(hi - lo for lo, hi in intervals)


def intersection_length(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """Length of the intersection of two merged, sorted interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def unit_gap(a: Window, b: Window, granularity: Granularity) -> float:
    """Whole granularity units between two windows (0 when they touch or overlap)."""
    (a_lo, a_hi), (b_lo, b_hi) = unit_span(a, granularity), unit_span(b, granularity)
    return max(b_lo - a_hi, a_lo - b_hi, 0.0)


def window_iou(pred: Iterable[Window], gold: Iterable[Window], granularity: Granularity) -> float:
    """Jaccard of the time covered by ``pred`` and by ``gold`` (see module docstring)."""
    p, g = covered_units(pred, granularity), covered_units(gold, granularity)
    if not p and not g:
        return 1.0
    if not p or not g:
        return 0.0
    inter = intersection_length(p, g)
    return inter / (total_length(p) + total_length(g) - inter)


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


def evidence_gain(retrieved_ids: Sequence[int], baseline_ids: Sequence[int], gold_ids: Iterable[int], k: int) -> float:
    """Evidence coverage of a window-driven retrieval minus that of the semantic channel
    alone (``baseline_ids``), in [-1, 1]: what a window adds (negative: what it pushed out)."""
    gold = list(gold_ids)
    return evidence_coverage(retrieved_ids, gold, k) - evidence_coverage(baseline_ids, gold, k)


# ---------------------------------------------------------------------- answers
_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
ABSTENTION_PHRASES = (
    "no information available",
    "not mentioned",
    "no information",
    "not available",
    "cannot be determined",
    "unknown",
    "not specified",
    "does not mention",
    "no mention",
)
MULTI_HOP = {"1", "multi-hop"}
ADVERSARIAL = {"5", "adversarial"}


def normalize_answer(text: str) -> str:
    text = str(text).lower().replace(",", " ").translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_tokens(text: str) -> list[str]:
    """The tokens answers are scored on (``normalize_answer``, split on spaces)."""
    return normalize_answer(text).split()


def token_f1(prediction: str, gold: str) -> float:
    p, g = answer_tokens(prediction), answer_tokens(gold)
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if not common:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def multi_answer_f1(prediction: str, gold: str) -> float:
    preds = [p for p in str(prediction).split(",") if p.strip()] or [""]
    golds = [g for g in str(gold).split(",") if g.strip()] or [""]
    return sum(max(token_f1(p, g) for p in preds) for g in golds) / len(golds)


def is_abstention(prediction: str) -> bool:
    text = normalize_answer(prediction)
    return any(phrase in text for phrase in ABSTENTION_PHRASES)


def answer_f1(prediction: str, gold: str | None, category: str | None) -> float:
    """F1 of ``prediction`` for a query of ``category`` (see module docstring)."""
    category = str(category) if category is not None else ""
    if category in ADVERSARIAL:
        return float(is_abstention(prediction))
    if gold is None:
        return 0.0
    if category in MULTI_HOP:
        return multi_answer_f1(prediction, gold)
    return token_f1(prediction, gold)
