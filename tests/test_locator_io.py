"""The locator's I/O contract: prompt building (ranking, truncation, no gold) and the parser."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import jsonschema
import pytest

from tider.locator.parse import ParseFailure, parse_prediction
from tider.locator.contract import OUTPUT_SCHEMA, PROMPT_VERSION
from tider.locator.prompt import build_messages
from tider.types import Gold, Query, Window


@dataclass(frozen=True)
class Entry:
    start: datetime
    end: datetime
    summary: str


def _query(**gold):
    return Query("q1", "m1", "When did we go to the offsite in lisbon?", datetime(2023, 6, 1, 9), user="alice",
                 category="absolute", gold=Gold(**gold))


RANKED = [Entry(datetime(2023, 5, i + 1), datetime(2023, 5, i + 2), f"event number {i} with some words") for i in range(10)][::-1]


def test_prompt_has_question_time_user_and_entries_in_time_order():
    system, user = build_messages(_query(), RANKED, "day")
    assert system["role"] == "system" and "YYYY-MM-DD" in system["content"]
    text = user["content"]
    assert "Question: When did we go to the offsite in lisbon?" in text
    assert "Asked at: 2023-06-01 by alice" in text
    lines = [l for l in text.splitlines() if l.startswith("[")]
    assert len(lines) == 10
    assert lines == sorted(lines)  # chronological, though ranked newest-first
    assert lines[0] == "[2023-05-01 .. 2023-05-02] event number 0 with some words"


def test_prompt_refuses_a_query_with_gold():
    with pytest.raises(ValueError, match="public"):
        build_messages(_query(answer="lisbon", evidence_ids=(3,)), RANKED, "day")


def test_truncation_drops_lowest_ranked_entries_to_fit(tiny_qwen3_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    full = build_messages(_query(), RANKED, "day", tokenizer=tok, max_prompt_tokens=10_000)
    n_full = len(tok.apply_chat_template(full, tokenize=True, add_generation_prompt=True)["input_ids"])
    budget = n_full - 30
    cut = build_messages(_query(), RANKED, "day", tokenizer=tok, max_prompt_tokens=budget)
    n_cut = len(tok.apply_chat_template(cut, tokenize=True, add_generation_prompt=True)["input_ids"])
    assert n_cut <= budget
    kept = [l for l in cut[1]["content"].splitlines() if l.startswith("[")]
    assert 0 < len(kept) < 10
    # The best-ranked entries survive: RANKED[0] is "event number 9".
    assert any("event number 9" in l for l in kept) and not any("event number 0 " in l + " " for l in kept)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        build_messages(_query(), RANKED, "day", tokenizer=tok, max_prompt_tokens=5)


def test_gold_completion_is_schema_valid_and_version_set():
    jsonschema.validate({"temporal": True, "windows": [{"start": "2023-05-01", "end": "2023-05-02"}]}, OUTPUT_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"temporal": True, "windows": [], "extra": 1}, OUTPUT_SCHEMA)
    assert PROMPT_VERSION


SPAN = Window(datetime(2023, 1, 1), datetime(2023, 12, 31, 18))


def test_parse_ok_with_think_block_prose_and_day_end():
    text = 'Let me see.<think>dates {"no": 1}</think> Sure: ```json\n{"temporal": true, "windows": [{"start": "2023-05-03", "end": "2023-05-04"}, {"start": "2023-01-01", "end": "2023-01-01"}]}\n```'
    r = parse_prediction(text, granularity="day", memory_span=SPAN)
    assert r.ok and r.failure is None
    assert r.prediction.windows == (
        Window(datetime(2023, 1, 1), datetime(2023, 1, 1, 23, 59, 59, 999999)),
        Window(datetime(2023, 5, 3), datetime(2023, 5, 4, 23, 59, 59, 999999)),
    )
    nt = parse_prediction('{"temporal": false, "windows": []}', granularity="day")
    assert nt.ok and nt.prediction.temporal is False and nt.prediction.windows == ()


def test_parse_minute_granularity_and_timezone():
    r = parse_prediction('{"temporal": true, "windows": [{"start": "2023-05-03T09:15", "end": "2023-05-03T12:00+02:00"}]}',
                         granularity="minute")
    assert r.ok
    (w,) = r.prediction.windows
    assert w.start == datetime(2023, 5, 3, 9, 15) and w.end == datetime(2023, 5, 3, 10, 0, 59, 999999)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("no json here", ParseFailure.NO_JSON),
        ('<think>{"temporal": true, "windows": []} still thinking', ParseFailure.NO_JSON),
        ('{"temporal": true, "windows": [{"start": "2023-05-03"', ParseFailure.NO_JSON),
        ('{"temporal": "yes", "windows": []}', ParseFailure.SCHEMA),
        ('{"temporal": true, "windows": [{"start": "2023-05-03"}]}', ParseFailure.SCHEMA),
        ('{"temporal": true, "windows": [], "note": 1}', ParseFailure.SCHEMA),
        ('{"temporal": true, "windows": []}', ParseFailure.SCHEMA),
        ('{"temporal": false, "windows": [{"start": "2023-05-03", "end": "2023-05-04"}]}', ParseFailure.SCHEMA),
        ('{"temporal": true, "windows": [{"start": "May third", "end": "2023-05-04"}]}', ParseFailure.BAD_DATE),
        ('{"temporal": true, "windows": [{"start": "2023-02-30", "end": "2023-05-04"}]}', ParseFailure.BAD_DATE),
        ('{"temporal": true, "windows": [{"start": "2023-05-05", "end": "2023-05-04"}]}', ParseFailure.START_AFTER_END),
        ('{"temporal": true, "windows": [{"start": "2025-05-05", "end": "2025-05-06"}]}', ParseFailure.OUTSIDE_MEMORY),
        (json.dumps({"temporal": True, "windows": [{"start": "2023-05-01", "end": "2023-05-01"}] * 9}), ParseFailure.TOO_MANY_WINDOWS),
    ],
)
def test_parse_failures_are_typed_never_raised(text, reason):
    r = parse_prediction(text, granularity="day", memory_span=SPAN)
    assert r.prediction is None and r.failure is reason and r.failure.value == reason.value


def test_parse_never_raises_on_garbage():
    for text in [None, 12, "", "{", "}{", "{}", '{"temporal": null}', "\x00" * 10, '{"temporal": true, "windows": [1]}']:
        r = parse_prediction(text, granularity="day")
        assert r.prediction is None and isinstance(r.failure, ParseFailure)
