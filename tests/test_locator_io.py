"""The locator's I/O contract (locator-v2): prompt building (cues, tagged lines, truncation, no gold),
the bounded output schema, and the parser with references."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import jsonschema
import pytest

from tider.locator.contract import OUTPUT_SCHEMA, PROMPT_VERSION
from tider.locator.parse import ParseFailure, Refs, parse_prediction
from tider.locator.prompt import PromptSettings, locator_input
from tider.types import Gold, Query, Window


def _query(**gold):
    return Query(
        "q1",
        "m1",
        "Which venue did we pick at the offsite last week?",
        datetime(2023, 5, 10, 18),
        user="alice",
        category="relative",
        gold=Gold(**gold),
    )


def _timeline(n_days: int = 20):
    """One message a day from 2023-04-21: an offsite report every other day, filler between;
    one entry per message; embeddings that make offsite reports the relevant ones."""
    import numpy as np

    from tider.retrieval.timeline import Timeline
    from tider.types import Memory, Message

    msgs = [
        Message(
            i,
            f"k{i}",
            f"we picked venue{i} as the venue at the offsite" if i % 2 == 0 else "coffee anyone?",
            datetime(2023, 4, 21, 10) + timedelta(days=i),
            "bob" if i % 2 == 0 else "erin",
            "s",
        )
        for i in range(n_days)
    ]
    memory = Memory("m1", msgs)
    emb = np.array([[1.0, 0.0] if i % 2 == 0 else [0.0, 1.0] for i in range(n_days)], dtype=np.float32)
    return memory, Timeline(memory, list(range(n_days)), emb, emb)  # one entry a message


def _input(settings=None, tokenizer=None, asked=datetime(2023, 5, 10, 18)):
    import numpy as np

    from tider.locator.rules import TimeCue

    memory, timeline = _timeline()
    week = TimeCue("last week", Window(datetime(2023, 5, 1), datetime(2023, 5, 7, 23, 59, 59, 999999)))
    return locator_input(
        _query(),
        memory,
        timeline.visible(asked),
        [week],
        "day",
        settings or PromptSettings(),
        query_vector=np.array([1.0, 0.0], dtype=np.float32),
        tokenizer=tokenizer,
    )


def test_prompt_question_first_cues_and_tagged_lines_in_time_order():
    table = _input()
    system, user = table.messages
    assert system["role"] == "system" and "YYYY-MM-DD" in system["content"]
    text = user["content"]
    assert text.startswith("Question: Which venue did we pick at the offsite last week?\nAsked at: 2023-05-10 by alice")
    assert 'C1 "last week" = 2023-05-01 .. 2023-05-07' in text
    lines = text.split("Timeline:\n")[1].splitlines()
    assert len(lines) == len(table.lines) == PromptSettings().lines.max_lines
    assert [l.rsplit(" | L", 1)[1] for l in lines] == [
        str(k) for k in range(1, len(lines) + 1)
    ]  # the tag ends the line
    assert [l[:10] for l in lines] == sorted(l[:10] for l in lines)  # time order
    marked = [l for l in lines if " C1 |" in l]
    assert marked and all("2023-05-01" <= l[:10] <= "2023-05-07" for l in marked)
    # no memory from the future: nothing after asked_at is shown
    assert all(l[:10] <= "2023-05-10" for l in lines)
    assert table.cues == (Window(datetime(2023, 5, 1), datetime(2023, 5, 7, 23, 59, 59, 999999)),)


def test_prompt_switches_for_the_ablation():
    from tider.locator.lines import LineConfig

    v1 = _input(
        PromptSettings(
            LineConfig(max_lines=6), select="similarity", show_cues=False, pointers=False, system_prompt=False
        )
    )
    (user,) = v1.messages
    assert "Cues:\n(none)" in user["content"] and " | L1" not in user["content"] and v1.lines == ()
    lines = user["content"].split("Timeline:\n")[1].splitlines()
    assert all("offsite" in l for l in lines)  # v1: only the most similar lines, any date


def test_prompt_can_repeat_the_question_after_the_timeline():
    plain, again = _input(), _input(PromptSettings(repeat_question=True))
    question = "Question: Which venue did we pick at the offsite last week?"
    assert not plain.messages[-1]["content"].endswith(question)
    assert again.messages[-1]["content"] == plain.messages[-1]["content"] + "\n" + question
    assert again.lines == plain.lines  # same table: the repeat is not a line


def test_prompt_refuses_a_query_with_gold():
    import numpy as np

    memory, timeline = _timeline()
    with pytest.raises(ValueError, match="public"):
        locator_input(
            _query(answer="lisbon", evidence_ids=(3,)),
            memory,
            timeline,
            [],
            "day",
            query_vector=np.array([1.0, 0.0], dtype=np.float32),
        )


def test_truncation_drops_the_least_needed_lines_to_fit(tiny_qwen3_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    full = _input(PromptSettings(max_prompt_tokens=100_000), tokenizer=tok)
    n_full = len(tok.apply_chat_template(full.messages, tokenize=True, add_generation_prompt=True)["input_ids"])
    cut = _input(PromptSettings(max_prompt_tokens=n_full - 60), tokenizer=tok)
    n_cut = len(tok.apply_chat_template(cut.messages, tokenize=True, add_generation_prompt=True)["input_ids"])
    assert n_cut <= n_full - 60 and 0 < len(cut.lines) < len(full.lines)
    # the best lines inside the cue (LineConfig.per_cue of them) are the most needed: they survive the cut
    in_cue = [w for w in cut.lines if datetime(2023, 5, 1) <= w.start and w.end <= datetime(2023, 5, 8)]
    assert len(in_cue) >= PromptSettings().lines.per_cue
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        _input(PromptSettings(max_prompt_tokens=5), tokenizer=tok)


def test_schema_bounds_references_to_the_table_and_version_set():
    table = _input()
    schema = table.schema()
    jsonschema.validate({"temporal": True, "windows": [{"entry": 14}, {"cue": 1}]}, schema)
    jsonschema.validate({"temporal": True, "windows": [{"start": "2023-05-01", "end": "2023-05-02"}]}, OUTPUT_SCHEMA)
    for bad in ({"entry": 15}, {"cue": 2}, {"entry": 0}, {"entry": 1, "cue": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"temporal": True, "windows": [bad]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"temporal": True, "windows": [], "extra": 1}, OUTPUT_SCHEMA)
    assert PROMPT_VERSION == "locator-v2"


def test_references_resolve_against_the_table_and_the_json_column():
    table = _input()
    text = '{"temporal": true, "windows": [{"entry": 3}, {"cue": 1}]}'
    for refs in (table, table.refs_json("day"), Refs.of(table)):
        r = parse_prediction(text, granularity="day", refs=refs)
        assert r.ok
        line = table.lines[2]
        assert r.prediction.windows == tuple(
            sorted(
                {
                    Window(
                        line.start.replace(hour=0, minute=0),
                        line.end.replace(hour=23, minute=59, second=59, microsecond=999999),
                    ),
                    Window(datetime(2023, 5, 1), datetime(2023, 5, 7, 23, 59, 59, 999999)),
                }
            )
        )
    bad = parse_prediction('{"temporal": true, "windows": [{"entry": 15}]}', granularity="day", refs=table)
    assert bad.failure is ParseFailure.BAD_REFERENCE and "15" in bad.detail
    no_table = parse_prediction('{"temporal": true, "windows": [{"cue": 1}]}', granularity="day")
    assert no_table.failure is ParseFailure.BAD_REFERENCE


def test_mark_answers_resolve_to_the_marked_line_when_trained_with_marks():
    from tider.locator.contract import MARKS_OUTPUT_SCHEMA, LocatorContractError, LocatorMetadata, schema_for
    from tider.train.examples import gold_answer

    plain, table = _input(), _input(PromptSettings(marks=True))
    assert plain.marks == () and "marks" not in json.loads(plain.refs_json("day"))
    assert '{"mark"' not in plain.messages[0]["content"] and '{"mark"' in table.messages[0]["content"]
    (k,) = [k for m, k in table.marks if m == "R"]
    lines = table.messages[-1]["content"].split("Timeline:\n")[1].splitlines()
    assert " R |" in lines[k - 1] and all(m == "R" or m.startswith("A") for m, _ in table.marks)  # never a cue mark
    by_entry = parse_prediction(f'{{"temporal": true, "windows": [{{"entry": {k}}}]}}', granularity="day", refs=table)
    for refs in (table, table.refs_json("day"), Refs.of(table)):
        r = parse_prediction('{"temporal": true, "windows": [{"mark": "R"}]}', granularity="day", refs=refs)
        assert r.ok and r.prediction == by_entry.prediction
    for refs in (plain, table):  # a label no line carries, or a table without marks: a typed failure
        bad = parse_prediction('{"temporal": true, "windows": [{"mark": "A+7"}]}', granularity="day", refs=refs)
        assert bad.failure is ParseFailure.BAD_REFERENCE and "A+7" in bad.detail
    jsonschema.validate({"temporal": True, "windows": [{"mark": "R"}]}, table.schema())
    for schema, label in ((table.schema(), "A+7"), (plain.schema(), "R"), (OUTPUT_SCHEMA, "R")):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"temporal": True, "windows": [{"mark": label}]}, schema)
    # the gold answer names the line by its mark only when the prompt answers by marks
    q = _query(temporal=True, windows=(table.lines[k - 1],), evidence_ids=(1,))
    assert gold_answer(q, table, "day")["windows"] == [{"mark": "R"}]
    assert gold_answer(q, plain, "day")["windows"] == [
        {"entry": [j for j, w in enumerate(plain.lines, 1) if w == table.lines[k - 1]][0]}
    ]
    # the metadata records the schema of its settings; a v2 checkpoint without marks keeps OUTPUT_SCHEMA
    assert schema_for(None) == schema_for({"marks": False}) == OUTPUT_SCHEMA
    settings = PromptSettings(marks=True).to_json()
    LocatorMetadata(prompt_settings=settings, output_schema=MARKS_OUTPUT_SCHEMA).validate("m")
    with pytest.raises(LocatorContractError, match="output_schema"):
        LocatorMetadata(prompt_settings=settings).validate("m")


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
    r = parse_prediction(
        '{"temporal": true, "windows": [{"start": "2023-05-03T09:15", "end": "2023-05-03T12:00+02:00"}]}',
        granularity="minute",
    )
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
        (
            json.dumps({"temporal": True, "windows": [{"start": "2023-05-01", "end": "2023-05-01"}] * 9}),
            ParseFailure.TOO_MANY_WINDOWS,
        ),
    ],
)
def test_parse_failures_are_typed_never_raised(text, reason):
    r = parse_prediction(text, granularity="day", memory_span=SPAN)
    assert r.prediction is None and r.failure is reason and r.failure.value == reason.value


def test_parse_never_raises_on_garbage():
    for text in [
        None,
        12,
        "",
        "{",
        "}{",
        "{}",
        '{"temporal": null}',
        "\x00" * 10,
        '{"temporal": true, "windows": [1]}',
    ]:
        r = parse_prediction(text, granularity="day")
        assert r.prediction is None and isinstance(r.failure, ParseFailure)
