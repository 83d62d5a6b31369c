"""The learning-free answers a locator prompt offers as options, so the best rule is always
one short answer away (``{"option": n}``) and the model learns *when* each one helps:

    Options:
    O1 rules = 2023-05-01 .. 2023-05-07 (+1 day)
    O2 top-days = 2023-04-26; 2023-05-03; 2023-05-10
    O3 top-day 1 = 2023-04-26
    ...

Each option is exactly what its source answers for the question (``rules``: every cue
padded by a day, the cue its core; ``top-days``: the first three days the semantic ranking
hits; ``top-day k``: the k-th of those days), numbered the same in every prompt
(``tider.locator.contract.OPTION_NAMES``). An option a question does not have (no time
expression, fewer hit days) is not listed, and pointing at it is a bad reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from tider.locator.contract import OPTION_NAMES
from tider.types import Granularity, Query, Window, format_time

RULES_PAD_DAYS = 1.0  # the rules source's default pad
TOP_DAYS = 3  # the top-days source's default


def learning_free_options(query: Query, store, cues: Sequence) -> tuple[tuple[Window, ...], ...]:
    """The windows of each option in ``OPTION_NAMES`` order; ``()`` where there is none."""
    from tider.locator.sources import TopDayWindow

    padded = tuple(sorted({c.window.widen(timedelta(days=RULES_PAD_DAYS)) for c in cues}))
    hit_days = TopDayWindow(days=TOP_DAYS).hit_days(query, store)
    singles = [(d,) for d in hit_days] + [()] * (TOP_DAYS - len(hit_days))
    return (padded, tuple(sorted(hit_days)), *singles)


def option_lines(options: Sequence[Sequence[Window]], granularity: Granularity) -> list[str]:
    """``O<n> <name> = <spans>`` for each option the question has."""
    lines = []
    for n, (name, windows) in enumerate(zip(OPTION_NAMES, options), start=1):
        if windows:
            spans = "; ".join(_span(w.anchor if name == "rules" else w, granularity) for w in windows)
            pad = f" (+{RULES_PAD_DAYS:g} day)" if name == "rules" else ""
            lines.append(f"O{n} {name} = {spans}{pad}")
    return lines


def _span(w: Window, granularity: Granularity) -> str:
    s, e = format_time(w.start, granularity), format_time(w.end, granularity)
    return s if s == e else f"{s} .. {e}"
