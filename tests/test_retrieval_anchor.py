"""Distance decay inside a window (issue 45, item 6): where similarity does not separate a
window's messages, closeness to what was asked does.

A recurring event: the same message every two hours for four weeks, so dense and BM25 scores
are equal and only the time tells the messages apart. ``rules`` pads the day a question
names by a day on each side; the pad's messages must not lead that day's."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest
from test_memory import NoEmbedder

from tider.memory import TemporalMemory
from tider.retrieval.config import RetrievalConfig
from tider.types import Window, WindowPrediction

ASKED = "which venue did we pick for the offsite on 2024-02-03?"
NAMED = datetime(2024, 2, 3).date()
START = datetime(2024, 1, 20)
DIM = 8


def recurring(n_days: int = 28) -> tuple[list[dict], np.ndarray, np.ndarray]:
    msgs = [
        {
            "key": f"m{i}",
            "text": "we picked the harbour hall as the venue for the offsite",
            "timestamp": (START + timedelta(hours=2 * i)).isoformat(),
            "speaker": "ann",
        }
        for i in range(12 * n_days)
    ]
    vec = np.zeros(DIM, dtype=np.float32)
    vec[0] = 1.0
    return msgs, np.tile(vec, (len(msgs), 1)), vec


CONFIGS = {
    "exact": RetrievalConfig(),
    "index": RetrievalConfig(index_min_messages=0, index_depth=1000),
}


def memory(kind: str, where) -> TemporalMemory:
    msgs, vecs, _ = recurring()
    mem = TemporalMemory(where, config=CONFIGS[kind], embedder=NoEmbedder())
    mem.add(msgs, vectors=vecs)
    return mem


def search(mem, kind: str, windows):
    _, _, qvec = recurring()
    asked = datetime(2024, 2, 20)
    return mem.search(ASKED, asked_at=asked, windows=windows, k=5, query_vector=qvec, exact=kind == "exact")


def days_of(hits) -> list:
    return [m.timestamp.date() for m in hits.messages]


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_day_a_question_names_leads_under_rules(kind, tmp_path):
    mem = memory(kind, tmp_path / kind)
    hits = search(mem, kind, "rules")
    window = hits.prediction.windows[0]
    assert (window.start.date(), window.end.date()) == (NAMED - timedelta(days=1), NAMED + timedelta(days=1))
    assert window.anchor.start.date() == window.anchor.end.date() == NAMED  # the pad is recorded, not lost
    # The window's nominations alternate with the semantic channel's (the earliest twins):
    # ranks 1, 3 and 5 are the window's, and every one of them is on the named day.
    from_window = [d for d in days_of(hits) if window.start.date() <= d <= window.end.date()]
    assert days_of(hits)[0] == NAMED
    assert from_window == [NAMED] * 3
    # Without the anchor (the same span, no core), the pad's first day would lead: ties by age.
    span = WindowPrediction(True, (Window(window.start, window.end),))
    plain = search(mem, kind, span)
    assert days_of(plain)[0] == NAMED - timedelta(days=1)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_named_day_leads_under_a_locator_window(kind, tmp_path):
    """A locator pointing at the cue (``{"cue": 1}``) answers the cue's range: the named day."""
    cue = WindowPrediction(True, (Window(datetime(2024, 2, 3), datetime(2024, 2, 3, 23, 59, 59, 999999)),))
    hits = search(memory(kind, None), kind, cue)
    assert days_of(hits)[0] == NAMED and days_of(hits).count(NAMED) == 3


def test_a_clearly_better_pad_message_still_leads():
    """The decay breaks near-ties; it does not hide a pad message twice as similar."""
    msgs, vecs, qvec = recurring()
    other = np.zeros(DIM, dtype=np.float32)
    other[1] = 1.0
    for i, m in enumerate(msgs):  # only one message of the pad's first day matches the query
        day = datetime.fromisoformat(m["timestamp"]).date()
        if day != NAMED - timedelta(days=1) or i % 12 != 5:
            vecs[i] = 0.4 * qvec + np.sqrt(1 - 0.4**2) * other
            m["text"] = "an unrelated remark about lunch"
    mem = TemporalMemory(None, config=RetrievalConfig(semantic="dense"), embedder=NoEmbedder())
    mem.add(msgs, vectors=vecs)
    hits = mem.search(ASKED, asked_at=datetime(2024, 2, 20), windows="rules", k=5, query_vector=qvec, exact=True)
    assert days_of(hits)[0] == NAMED - timedelta(days=1)  # cosine 1.0 against 0.4 on the named day


def test_widen_keeps_the_anchor_and_clipping_cuts_it():
    day = Window(datetime(2024, 2, 3), datetime(2024, 2, 3, 23, 59))
    padded = day.widen(timedelta(days=1)).widen(timedelta(days=1))
    assert padded.anchor == day and padded == Window(padded.start, padded.end)  # equality is the span
    clipped = padded.clip_end(datetime(2024, 2, 3, 12))
    assert clipped.anchor == Window(day.start, datetime(2024, 2, 3, 12))
    assert padded.clip_end(datetime(2024, 2, 2, 12)).core is None
    with pytest.raises(ValueError, match="not inside"):
        Window(day.start, day.end, Window(day.start, day.end + timedelta(days=1)))
