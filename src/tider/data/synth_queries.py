"""Questions for the synthetic benchmark: several phrasings per type, each unambiguous.

Every builder returns ``(text, answer, evidence refs, asked_at day or None)`` or None when
the draw would be ambiguous (the caller draws again). ``asked_at`` None means the end of
the conversation; relative and vague questions are asked on the day their phrase needs.

Types (``Query.category``) and what fixes the gold window:

- ``absolute``: a date in one of five formats, a month, or part of a month ("in early
  March"); a date library resolves the date and the month, and "early March" to the
  whole first half, where the question means days 1-10;
- ``relative``: "yesterday", "two days ago", "the day before yesterday", "last week",
  "two weeks ago", "the week before last" (calendar weeks), "last month", "two months
  ago", "last weekend" - resolved against ``asked_at``; a library reads some of these as
  points ("two weeks ago" = that very day) or not at all ("the week before last");
- ``vague``: "a few days ago" (2-6 days back), "the other day" (1-4), "recently" (the
  latest instance, at most two weeks back), "earlier this week", "earlier this month" -
  no library resolves them to the intended range;
- ``anchored``: relative to a one-off milestone ("the first offsite after the reorg",
  "the review just before the office move", "the lunch in the week of the rebrand");
- ``multi2`` / ``multi3``: two or three dates, two months of a monthly event, or "the
  last two ... before" / "the first three ... after" a milestone;
- ``current_state``: the latest update of a state chain at ``asked_at`` ("current",
  "now", "latest", "last set to", "at the moment");
- ``non_temporal``: a personal fact that never changes.
"""

from __future__ import annotations

import bisect
import itertools
from datetime import date, timedelta

MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
# relative phrase -> (unit, how many back); weeks are calendar weeks (Monday-Sunday)
RELATIVE = {
    "yesterday": ("day", 1),
    "the day before yesterday": ("day", 2),
    "two days ago": ("day", 2),
    "three days ago": ("day", 3),
    "last week": ("week", 1),
    "two weeks ago": ("week", 2),
    "the week before last": ("week", 2),
    "last month": ("month", 1),
    "two months ago": ("month", 2),
    "last weekend": ("weekend", 1),
}
MONTH_PARTS = {"in early {m}": (1, 10), "in mid-{m}": (11, 20), "in late {m}": (21, 31)}
ASKS = [
    "Which {attr} did we pick at {how}?",
    "What {attr} did we go with at {how}?",
    "At {how}, which {attr} was chosen?",
    "Remind me, what was the {attr} at {how}?",
]
ASKS_PLURAL = ["Which {attrs} did we pick at {how}?", "What {attrs} did we go with at {how}?"]
AFTER = [
    "the first {e} after the {m}",
    "the {e} right after the {m}",
    "the next {e} after the {m}",
    "the {e} following the {m}",
]
BEFORE = [
    "the last {e} before the {m}",
    "the {e} just before the {m}",
    "the final {e} before the {m}",
    "the {e} that preceded the {m}",
]
CURRENT = [
    "What is the current {param} of project {p}?",
    "What is the {param} of project {p} now?",
    "What is the latest {param} for project {p}?",
    "What did we last set the {param} of project {p} to?",
    "Which {param} is project {p} on at the moment?",
]
FACT_ASKS = ["What is {who}'s {fact}?", "Do you remember {who}'s {fact}?", "What's the {fact} of {who}?"]


def month_start(d: date, back: int) -> date:
    index = d.year * 12 + d.month - 1 - back
    return date(index // 12, index % 12 + 1, 1)


def relative_period(asked: date, phrase: str) -> tuple[date, date]:
    """The closed day range a relative phrase denotes when asked on ``asked``."""
    unit, back = RELATIVE[phrase]
    if unit == "day":
        day = asked - timedelta(days=back)
        return day, day
    if unit in ("week", "weekend"):
        monday = asked - timedelta(days=asked.weekday() + 7 * back)
        return (
            (monday + timedelta(days=5), monday + timedelta(days=6))
            if unit == "weekend"
            else (monday, monday + timedelta(days=6))
        )
    return month_start(asked, back), month_start(asked, back - 1) - timedelta(days=1)


def date_text(d: date, style: int) -> str:
    """One of five ways people write a date."""
    month = MONTHS[d.month - 1]
    suffix = "th" if 11 <= d.day <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(d.day % 10, "th")
    return [
        d.isoformat(),
        f"{month} {d.day}",
        f"{month} {d.day}, {d.year}",
        f"{d.day} {month} {d.year}",
        f"the {d.day}{suffix} of {month}",
    ][style]


class Questions:
    """Question builders over one generated conversation (``synth._Conversation``)."""

    def __init__(self, conv):
        self.c, self.rng = conv, conv.rng

    def _event(self):
        event = self.rng.choice(sorted(self.c.instances))
        return event, self.c.instances[event], self.c.event_attr(event)

    def _ask(self, attr: str, how: str, plural: bool = False) -> str:
        attrs = attr + ("es" if attr.endswith(("sh", "ch", "s")) else "s")
        return self.rng.choice(ASKS_PLURAL if plural else ASKS).format(attr=attr, attrs=attrs, how=how)

    def _recent(self, day: date) -> bool:
        """Whether a date written without its year ("May 7", "in March") can only mean
        ``day`` when asked at the end: it lies within the last year of the conversation."""
        return (self.c.end - day).days < 330

    def _unique_in(self, instances, lo: date, hi: date):
        days = [i.day for i in instances]
        a, b = bisect.bisect_left(days, lo), bisect.bisect_right(days, hi)
        return instances[a] if b - a == 1 else None

    def absolute(self):
        event, instances, attr = self._event()
        inst, roll = self.rng.choice(instances), self.rng.random()
        if roll < 0.55:
            style = self.rng.randrange(5)
            if style in (1, 4) and not self._recent(inst.day):
                style = 0
            return self._ask(attr, f"the {event} on {date_text(inst.day, style)}"), inst.value, [inst.evidence], None
        if roll < 0.8:
            first = inst.day.replace(day=1)
            if self._unique_in(instances, first, month_start(inst.day, -1) - timedelta(days=1)) is None:
                return None
            with_year = self.rng.random() < 0.5 or not self._recent(inst.day)
            cue = MONTHS[inst.day.month - 1] + (f" {inst.day.year}" if with_year else "")
            return self._ask(attr, f"the {event} in {cue}"), inst.value, [inst.evidence], None
        phrase, (lo, hi) = self.rng.choice(sorted(MONTH_PARTS.items()))
        if not self._recent(inst.day):
            return None
        last = (month_start(inst.day, -1) - timedelta(days=1)).day
        span = (inst.day.replace(day=lo), inst.day.replace(day=min(hi, last)))
        if not span[0] <= inst.day <= span[1] or self._unique_in(instances, *span) is None:
            return None
        return (
            self._ask(attr, f"the {event} {phrase.format(m=MONTHS[inst.day.month - 1])}"),
            inst.value,
            [inst.evidence],
            None,
        )

    def relative(self):
        event, instances, attr = self._event()
        inst, phrase = self.rng.choice(instances), self.rng.choice(sorted(RELATIVE))
        unit, back = RELATIVE[phrase]
        if unit == "day":
            asked = inst.day + timedelta(days=back)
        elif unit in ("week", "weekend"):
            if unit == "weekend" and inst.day.weekday() < 5:
                return None
            asked = (
                inst.day
                - timedelta(days=inst.day.weekday())
                + timedelta(days=7 * back + self.rng.randint(0, 4 if unit == "weekend" else 6))
            )
        else:
            asked = month_start(inst.day, -back) + timedelta(days=self.rng.randint(0, 27))
        lo, hi = relative_period(asked, phrase)
        if not lo <= inst.day <= hi or self._unique_in(instances, lo, hi) is None:
            return None
        return self._ask(attr, f"the {event} {phrase}"), inst.value, [inst.evidence], asked

    def vague(self):
        event, instances, attr = self._event()
        inst, phrase = (
            self.rng.choice(instances),
            self.rng.choice(["a few days ago", "the other day", "recently", "earlier this week", "earlier this month"]),
        )
        if phrase == "a few days ago":
            asked = inst.day + timedelta(days=self.rng.randint(2, 6))
            lo, hi = asked - timedelta(days=6), asked - timedelta(days=2)
        elif phrase == "the other day":
            asked = inst.day + timedelta(days=self.rng.randint(1, 4))
            lo, hi = asked - timedelta(days=4), asked - timedelta(days=1)
        elif phrase == "recently":  # the latest instance, at most two weeks back
            asked = inst.day + timedelta(days=self.rng.randint(1, 14))
            lo, hi = inst.day, asked - timedelta(days=1)
        elif phrase == "earlier this week":
            if inst.day.weekday() > 4:
                return None
            asked = inst.day + timedelta(days=self.rng.randint(1, 6 - inst.day.weekday()))
            lo, hi = asked - timedelta(days=asked.weekday()), asked - timedelta(days=1)
        else:
            if inst.day.day > 24:
                return None
            asked = inst.day + timedelta(days=self.rng.randint(1, min(27 - inst.day.day + 1, 10)))
            lo, hi = asked.replace(day=1), asked - timedelta(days=1)
        if asked.month != inst.day.month and phrase == "earlier this month":
            return None
        if not lo <= inst.day <= hi or self._unique_in(instances, lo, hi) is None:
            return None
        return (
            self._ask(attr, f"the {event} {phrase}" if phrase != "recently" else f"the {event} we had recently"),
            inst.value,
            [inst.evidence],
            asked,
        )

    def anchored(self):
        event, instances, attr = self._event()
        name = self.rng.choice(sorted(self.c.milestones))
        anchor, roll = self.c.milestones[name][0], self.rng.random()
        if roll < 0.45:
            after = [i for i in instances if i.day > anchor]
            inst, how = (after[0] if after else None), self.rng.choice(AFTER)
        elif roll < 0.9:
            before = [i for i in instances if i.day < anchor]
            inst, how = (before[-1] if before else None), self.rng.choice(BEFORE)
        else:
            monday = anchor - timedelta(days=anchor.weekday())
            inst, how = self._unique_in(instances, monday, monday + timedelta(days=6)), "the {e} in the week of the {m}"
        if inst is None:
            return None
        return self._ask(attr, how.format(e=event, m=name)), inst.value, [inst.evidence], None

    def _multi(self, n: int):
        event, instances, attr = self._event()
        roll = self.rng.random()
        if roll < 0.25 and self.c.milestones:
            name = self.rng.choice(sorted(self.c.milestones))
            anchor = self.c.milestones[name][0]
            before, after = [i for i in instances if i.day < anchor], [i for i in instances if i.day > anchor]
            word = {2: "two", 3: "three"}[n]
            if self.rng.random() < 0.5 and len(before) >= n:
                chosen, how = before[-n:], f"the last {word} {event}s before the {name}"
            elif len(after) >= n:
                chosen, how = after[:n], f"the first {word} {event}s after the {name}"
            else:
                return None
        else:
            if len(instances) <= n:  # keep at least one same-event distractor outside the windows
                return None
            chosen = sorted(self.rng.sample(instances, n), key=lambda i: i.day)
            style = self.rng.randrange(5)
            if style in (1, 4) and not all(self._recent(i.day) for i in chosen):
                style = 0
            parts = [f"on {date_text(i.day, style)}" for i in chosen]
            how = f"the {event} " + (" and ".join(parts) if n == 2 else f"{parts[0]}, {parts[1]} and {parts[2]}")
        # Separate windows only: neighbours must be further apart than the merge gap.
        if any((b.day - a.day).days < 3 for a, b in itertools.pairwise(chosen)):
            return None
        return self._ask(attr, how, plural=True), "; ".join(i.value for i in chosen), [i.evidence for i in chosen], None

    def multi2(self):
        return self._multi(2)

    def multi3(self):
        return self._multi(3)

    def current_state(self):
        """Asked at the end (the last update is current) or between two updates (the
        latest one before ``asked_at`` is current; later ones do not exist yet)."""
        if not self.c.chains:
            return None
        project, param, chain = self.rng.choice(self.c.chains)
        step = self.rng.randrange(1, len(chain))  # at least one stale update before it
        day, value, ref = chain[step]
        asked = None
        if step + 1 < len(chain):
            asked = day + timedelta(days=self.rng.randint(1, (chain[step + 1][0] - day).days - 1))
        return self.rng.choice(CURRENT).format(param=param, p=project), value, [ref], asked

    def non_temporal(self):
        person, fact, value, ref = self.rng.choice(self.c.facts)
        return self.rng.choice(FACT_ASKS).format(who=person, fact=fact), value, [ref], None
