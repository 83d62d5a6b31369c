"""The ``rules`` window source: time expressions resolved against asked_at by Recognizers-Text."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from tider.locator.rules import CueResolver, RulesWindows, query_cues
from tider.locator.sources import make_source
from tider.types import NON_TEMPORAL, Memory, Message, Query, Window

ASKED = datetime(2023, 5, 10, 18, 0)  # a Wednesday


def days(cues):
    return [(c.window.start.date().isoformat(), c.window.end.date().isoformat()) for c in cues]


@pytest.fixture(scope="module")
def resolver():
    return CueResolver()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Which venue did we pick at the offsite last week?", [("2023-05-01", "2023-05-07")]),  # Monday-Sunday
        ("What did we decide last month?", [("2023-04-01", "2023-04-30")]),
        ("Who called yesterday?", [("2023-05-09", "2023-05-09")]),
        ("What happened two days ago?", [("2023-05-08", "2023-05-08")]),
        ("What happened last weekend?", [("2023-05-06", "2023-05-07")]),
        ("What changed since March?", [("2023-03-01", "2023-05-10")]),  # open range closed by asked_at
        (
            "Which dish on 2023-04-02 and on April 20, 2023?",
            [("2023-04-02", "2023-04-02"), ("2023-04-20", "2023-04-20")],
        ),
        ("What did we pick in June?", [("2022-06-01", "2022-06-30")]),  # year-less: the latest June not in the future
        ("What did we pick in early March?", [("2023-03-01", "2023-03-15")]),  # the library's reading of "early"
    ],
)
def test_expressions_resolve_against_asked_at(resolver, text, expected):
    assert days(resolver.resolve(text, ASKED)) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        # The library reads these as "the week" (the current one) + "before August 3, 2023"
        # (everything before it), and "the day before May 3" as May 3: composed into the span.
        ("What did John do the week before August 3, 2022?", [("2022-07-27", "2022-08-02")]),
        ("What did we do the weekend before 4th October, 2022?", [("2022-10-01", "2022-10-02")]),  # a Tuesday
        ("What did we decide the week after May 3?", [("2023-05-04", "2023-05-10")]),
        ("What did we do the weekend after April 5?", [("2023-04-08", "2023-04-09")]),
        ("What happened the month after March 3?", [("2023-03-04", "2023-04-03")]),
        ("What happened the day before May 3?", [("2023-05-02", "2023-05-02")]),
        ("What happened the day after May 3?", [("2023-05-04", "2023-05-04")]),
        ("What happened two days before May 3?", [("2023-05-01", "2023-05-01")]),  # a count: one day
        ("What happened a week before April 9, 2023?", [("2023-04-02", "2023-04-02")]),
        ("What did we do the year before 2023?", [("2022-01-01", "2022-12-31")]),
    ],
)
def test_spans_anchored_to_a_time_are_composed(resolver, text, expected):
    assert days(resolver.resolve(text, ASKED)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "What did we pick at the design review in the week of the merger?",
        "What happened the month before the reorg?",
        "What did Melanie do the week before her birthday?",
    ],
)
def test_spans_anchored_to_an_event_are_not_the_current_period(resolver, text):
    # Unmodified, the library gives the week/month of asked_at for these.
    assert resolver.resolve(text, ASKED) == ()
    assert days(resolver.resolve("What did we decide during the week?", ASKED)) == [("2023-05-08", "2023-05-14")]


@pytest.mark.parametrize(
    "text",
    [
        "What is the current region of project cobalt?",
        "What did we paint recently?",
        "How long did the offsite last?",
        "What is dave's pet?",
    ],
)
def test_no_resolvable_expression_means_no_cue(resolver, text):
    assert resolver.resolve(text, ASKED) == ()


def _memory(first: datetime, last: datetime) -> Memory:
    n = (last - first).days + 1
    return Memory("m", [Message(i, f"m{i}", f"message {i}", first + timedelta(days=i), "ana", "s") for i in range(n)])


def _query(text: str, asked: datetime = ASKED) -> Query:
    return Query("q", "m", text, asked)


def test_rules_source_pads_clips_and_falls_back_to_semantic(resolver):
    from tider.memory import MemoryCollection

    memory = _memory(datetime(2023, 1, 2, 9), datetime(2023, 6, 30, 9))
    store = MemoryCollection({memory.key: memory})
    source = make_source("rules", pad_days=1.0)
    assert isinstance(source, RulesWindows)
    p = source.predict(_query("Which venue did we pick at the offsite last week?"), store)
    assert p.temporal and p.windows == (Window(datetime(2023, 4, 30), datetime(2023, 5, 8, 23, 59, 59, 999999)),)
    # "4 years ago" and "in 2010" name times before the memory began: nothing to localize.
    assert source.predict(_query("Where did she move from 4 years ago?"), store) == NON_TEMPORAL
    assert source.predict(_query("What did we build in 2010?"), store) == NON_TEMPORAL
    assert source.predict(_query("What is dave's pet?"), store) == NON_TEMPORAL
    # A range is cut at what the question can see: the memory's start and asked_at.
    (cue,) = query_cues(resolver, _query("What did we change this year?"), memory)
    assert cue.window.start == datetime(2023, 1, 2) and cue.window.end.date() == ASKED.date()
    two = source.predict(_query("Which dish on 2023-04-02 and on 2023-04-20?"), store)
    assert len(two.windows) == 2


def test_cues_persist_across_processes_and_a_torn_line_is_skipped(tmp_path):
    path = tmp_path / "cues.jsonl"
    first = CueResolver(cache_path=path)
    cues = first.resolve("the offsite last week", ASKED)
    with open(path, "a") as f:
        f.write('{"text": "torn')  # a run killed mid-write
    second = CueResolver(cache_path=path)
    second._parse = lambda *a: pytest.fail("a cached question must not be parsed again")
    assert second.resolve("the offsite last week", ASKED) == cues


def test_cached_resolutions_of_an_older_resolver_are_not_reused(tmp_path):
    path = tmp_path / "cues.jsonl"
    CueResolver(cache_path=path).resolve("the offsite last week", ASKED)
    row = json.loads(path.read_text())
    row["v"] -= 1
    row["cues"] = [["last week", "2020-01-01T00:00:00", "2020-01-07T23:59:59.999999"]]
    path.write_text(json.dumps(row) + "\n")
    assert days(CueResolver(cache_path=path).resolve("the offsite last week", ASKED)) == [("2023-05-01", "2023-05-07")]


def test_resolving_many_in_worker_processes_matches_one_by_one_and_is_cached(tmp_path, resolver):
    phrases = ["last week", "two days ago", "in March", "since April 3", "yesterday", "on Sunday", "nothing dated"]
    keys = [
        (f"what did we say {phrases[i % len(phrases)]}?", ASKED - timedelta(days=i), ASKED - timedelta(days=400))
        for i in range(130)  # two workers from 128 new questions on (64 each)
    ]
    path = tmp_path / "cues.jsonl"
    many = CueResolver(cache_path=path)
    assert many.resolve_many(keys + keys[:5], workers=2) == 130  # repeats count once
    assert all(many.resolve(*k) == resolver.resolve(*k) for k in keys)
    assert len(path.read_text().splitlines()) == 130
    again = CueResolver(cache_path=path)
    assert again.resolve_many(keys, workers=2) == 0
