"""Which timeline entries the locator prompt shows, and the marks on them (locator-v3).

A locator can only point at what it is shown. v1 showed the top-K entries by similarity
to the question; on a memory where an event recurs weekly, the K most similar entries
are K arbitrary twins of the event and the one the question asks about is usually not
among them. v2 picks entries for what the question's *structure* can need, and marks the
relations a date library can compute, so that the model's job is to read the question
and pick (docs/design.md, decision 11). Every rule is learning-free and dataset-agnostic:

- **cues** ``C<j>``: the best-matching entries inside each resolved time cue (``rules``),
  marked with the cue's number ("the offsite last week" -> the offsite of that week);
- **anchor** ``A``: when the question relates its answer to another event ("before",
  "after", "since"...), the best entry holding the question's rarest term when few entries
  have it ("reorg"), with its nearest *relevant* entries before and after it marked
  ``A-1``, ``A-2``... and ``A+1``... ("the last review before the reorg" is ``A-1``);
- **recent** ``R``: the latest relevant entry by ``asked_at`` ("the current region");
- **hits** ``H1``, ``H2``...: the entries holding the semantic channel's best-ranked
  messages, in the order of their first hit (retrieve, then localize: on real
  conversations the evidence's day is among the first few days the semantic channel
  hits for most questions, and a question rarely names its time);
- **semantic**: the top entries by similarity (what v1 showed), then more to fill.

Priority, for when the token budget drops lines from the end: cue lines, the anchor and
its nearest neighbour on each side, the hits, the recent lines, the anchor's further
neighbours, the semantic ones.

An entry's similarity to the question is that of its best message (``entry_scores``), not
of its centroid: a cluster that holds the evidence next to small talk must still rank as
the evidence does. "Relevant" = within ``relevant_margin`` (cosine) of the best entry:
near-identical twins of the asked-about event are, everything else is not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np


@dataclass(frozen=True)
class LineConfig:
    max_lines: int = 30  # the production recipe's; the tiny recipes show 14
    semantic: int = 3  # top entries by similarity, always shown
    per_cue: int = 2  # best entries overlapping each cue
    recent: int = 2  # latest relevant entries (the latest is marked R)
    anchor_neighbours: int = 3  # relevant entries shown on each side of the anchor (A-1.., A+1..)
    relevant_margin: float = 0.15  # cosine below the best entry's that still counts as relevant
    anchor_max_share: float = 0.03  # a term is an anchor when at most this share of entries has it
    mark_pad_days: float = 3.0  # a one-day cue marks lines within this many days (its reading is a point)
    hits: int = 5  # entries holding the semantic channel's best hits, marked H1..H<hits>
    hit_depth: int = 50  # how far down the semantic ranking hits are looked for and counted


@dataclass
class Selection:
    """Entries to show, most needed first (a token budget drops from the end), and the
    marks of each shown entry (by index into the visible timeline)."""

    picked: list[int] = field(default_factory=list)
    marks: dict[int, list[str]] = field(default_factory=dict)

    def mark(self, i: int, label: str) -> None:
        self.marks.setdefault(i, []).append(label)


def _terms(text: str) -> set[str]:
    from tider.retrieval.bm25 import tokenize

    return {t for t in tokenize(text) if not t.isdigit()}


def _member_terms(timeline, members) -> set[str]:
    return set().union(*(_terms(timeline.memory[i].text) for i in members))


def entry_terms(timeline) -> list[set[str]]:
    """Terms of every entry's member messages. Cached on the full timeline: a visible view
    (``Timeline.visible``) shares all its clusters but the last, so it reuses the cache."""
    full = timeline.parent or timeline
    cached = getattr(full, "_entry_terms", None)
    if cached is None or len(cached) != len(full):
        cached = full._entry_terms = [_member_terms(full, full.members(j)) for j in range(len(full))]
    if full is timeline:
        return cached
    return [
        cached[j] if timeline.members(j) == full.members(j) else _member_terms(timeline, timeline.members(j))
        for j in range(len(timeline))
    ]


def cue_spans(cues: Sequence, pad: timedelta) -> list:
    """The span each cue marks: a one-day cue is widened by ``pad`` (its reading is a
    point: "two weeks ago" is a day in that week, not necessarily the asked-about one)."""
    return [c.window.widen(pad) if (c.window.end - c.window.start) <= timedelta(days=1) else c.window for c in cues]


# An anchor is another event the question places its answer against ("the review before
# the reorg"): only a question with such a relation has one. Without this, a rare word of any
# real question ("wine" in "when did they go wine tasting?") made an anchor and marks A±k
# that mean nothing there.
RELATION = re.compile(
    r"\b(after|before|following|preceding|preceded|prior to|since|until|till|week of)\b", re.IGNORECASE
)


def _anchor(
    question: str, cues: Sequence, terms: list[set[str]], sims: np.ndarray, relevant: Sequence[int], config: LineConfig
) -> int | None:
    """The anchor: the best entry holding the question's rarest term, when few entries
    hold it and the term is not the asked-about event's own word (most relevant entries
    hold it: "budget" in "the budget meeting last month"); an anchor is *another* event
    ("the review before the reorg"). Words of the time cues are the date library's ("May"
    in "on May 20"), not candidates."""
    if not RELATION.search(question):
        return None
    cue_words = set().union(*(_terms(c.text) for c in cues)) if cues else set()
    counts = {t: sum(t in s for s in terms) for t in _terms(question) - cue_words}
    rare = [
        t
        for t, n in counts.items()
        if 0 < n <= max(1, config.anchor_max_share * len(terms))
        and sum(t in terms[i] for i in relevant) < 0.5 * len(relevant)
    ]
    if not rare:
        return None
    term = min(rare, key=lambda t: (counts[t], t))
    holders = [i for i, s in enumerate(terms) if term in s]
    return max(holders, key=lambda i: (sims[i], -i))


def select_lines(
    question: str, timeline, sims: np.ndarray, cues: Sequence, config: LineConfig = LineConfig(), hits=()
) -> Selection:
    """The entries of the visible ``timeline`` to show for ``question``, and their marks.
    ``hits``: entry indices holding the semantic channel's best messages, best first."""
    out = Selection()
    spans = [timeline.span(j) for j in range(len(timeline))]
    n = len(spans)
    if n == 0:
        return out
    by_sim = [int(i) for i in np.lexsort((np.arange(n), -sims))]
    relevant = sorted(i for i in by_sim if sims[i] >= sims[by_sim[0]] - config.relevant_margin)

    def add(ids) -> None:
        for i in ids:
            if i not in out.picked and len(out.picked) < config.max_lines:
                out.picked.append(i)

    for j, span in enumerate(cue_spans(cues, timedelta(days=config.mark_pad_days)), start=1):
        inside = [i for i in by_sim if spans[i].start <= span.end and spans[i].end >= span.start]
        add(inside[: config.per_cue])
        for i in inside:
            out.mark(i, f"C{j}")
    anchor = _anchor(question, cues, entry_terms(timeline), sims, relevant, config)
    later = []
    if anchor is not None:
        add([anchor])
        out.mark(anchor, "A")
        before = [i for i in relevant if i < anchor][::-1][: config.anchor_neighbours]
        after = [i for i in relevant if i > anchor][: config.anchor_neighbours]
        for side, ids in (("-", before), ("+", after)):
            add(ids[:1])
            later += ids[1:]
            for k, i in enumerate(ids, start=1):
                out.mark(i, f"A{side}{k}")
    if relevant:
        out.mark(relevant[-1], "R")
    for k, i in enumerate(list(dict.fromkeys(hits))[: config.hits], start=1):
        out.mark(i, f"H{k}")
        add([i])
    add(relevant[::-1][: config.recent])
    add(later)
    add(by_sim[: config.semantic])
    add(by_sim)
    return out


def entry_scores(timeline, message_sims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(score, best_member)`` per entry: the best member message's similarity and position.
    Clusters are contiguous position runs, so this is one ``maximum.reduceat``."""
    n = len(timeline)
    if n == 0:
        return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
    starts = np.asarray(timeline.starts, dtype=np.int64)
    sims = np.asarray(message_sims, dtype=np.float32)[: timeline.end]
    best_score = np.maximum.reduceat(sims, starts)
    best_id = np.array(
        [
            timeline.starts[j] + int(np.argmax(sims[timeline.members(j).start : timeline.members(j).stop]))
            for j in range(n)
        ],
        dtype=np.int64,
    )
    return best_score, best_id
