"""The locator's I/O contract (locator-v3): prompt building (cues, tagged lines, what retrieval sees,
truncation, no gold),
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


def _store(n_days: int = 20):
    """One message a day from 2023-04-21: an offsite report every other day, small talk
    between (a real ``MemoryCollection``: MiniLM embeddings, the timeline, the hybrid
    ranking). The question is asked on day 19, after the last message."""
    from tider.memory import MemoryCollection
    from tider.types import Memory, Message

    msgs = [
        Message(
            i,
            f"k{i}",
            f"we picked venue{i} as the venue at the offsite" if i % 2 == 0 else f"coffee anyone? round {i}",
            datetime(2023, 4, 21, 10) + timedelta(days=i),
            "bob" if i % 2 == 0 else "erin",
            "s",
        )
        for i in range(n_days)
    ]
    return MemoryCollection({"m1": Memory("m1", msgs)})


WEEK = Window(datetime(2023, 5, 1), datetime(2023, 5, 7, 23, 59, 59, 999999))


def _input(settings=None, tokenizer=None, store=None):
    from tider.locator.rules import TimeCue

    return locator_input(
        _query(), store or _store(), [TimeCue("last week", WEEK)], settings or PromptSettings(), tokenizer=tokenizer
    )


def _lines(table) -> list[str]:
    return table.messages[-1]["content"].split("Timeline:\n")[1].splitlines()


def test_prompt_question_first_cues_and_tagged_lines_in_time_order():
    from tider.locator.lines import LineConfig

    table = _input(PromptSettings(LineConfig(max_lines=14)))
    system, user = table.messages
    assert system["role"] == "system" and "YYYY-MM-DD" in system["content"]
    text = user["content"]
    assert text.startswith("Question: Which venue did we pick at the offsite last week?\nAsked at: 2023-05-10 by alice")
    assert 'C1 "last week" = 2023-05-01 .. 2023-05-07' in text
    lines = _lines(table)
    assert len(lines) == len(table.lines) == 14
    assert [line.rsplit(" | L", 1)[1] for line in lines] == [str(k) for k in range(1, 15)]  # the tag ends the line
    assert [line[:10] for line in lines] == sorted(line[:10] for line in lines)  # time order
    marked = [line for line in lines if " C1 " in line.split(" | ")[0] + " "]
    assert marked and all("2023-05-01" <= line[:10] <= "2023-05-07" for line in marked)
    assert all(line[:10] <= "2023-05-10" for line in lines)  # no memory from the future
    assert table.cues == (WEEK,)


def test_lines_say_what_retrieval_sees():
    """Retrieve, then localize: H1.. mark the lines holding the semantic channel's best
    hits in order; h<n>/<m> counts the top-50 hits and the messages in a line's days."""
    store = _store()
    table = _input(store=store)
    lines = _lines(table)
    ranked = store.ranking(_query().public()).ids
    memory = store.messages("m1")
    top_day = memory[int(ranked[0])].timestamp.date().isoformat()
    (h1,) = [line for line in lines if " H1" in line.split(" | ")[0]]
    assert h1.startswith(top_day)
    hits = [int(line.split(" | ")[1][1:].split("/")[0]) for line in lines]
    sizes = [int(line.split(" | ")[1].split("/")[1]) for line in lines]
    assert sizes == [1] * len(lines) and sum(hits) == len(lines)  # one message a day, all within the top 50
    labels = [m for m, _ in table.marks]
    assert {"H1", "H2", "H3", "H4", "H5"} <= set(labels) and not any(m.startswith(("C", "T")) for m in labels)
    # T marks a line on the day the question is asked
    late = locator_input(Query("q2", "m1", "What did we pick?", datetime(2023, 5, 10, 12)), store, [], PromptSettings())
    assert " T |" in _lines(late)[-1] and _lines(late)[-1].startswith("2023-05-10")


def test_prompt_refuses_a_query_with_gold():
    with pytest.raises(ValueError, match="public"):
        locator_input(_query(answer="lisbon", evidence_ids=(3,)), _store(), [])


def test_truncation_drops_the_least_needed_lines_to_fit(tiny_qwen3_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    store = _store()
    full = _input(PromptSettings(max_prompt_tokens=100_000), tokenizer=tok, store=store)
    n_full = len(tok.apply_chat_template(full.messages, tokenize=True, add_generation_prompt=True)["input_ids"])
    cut = _input(PromptSettings(max_prompt_tokens=n_full - 60), tokenizer=tok, store=store)
    n_cut = len(tok.apply_chat_template(cut.messages, tokenize=True, add_generation_prompt=True)["input_ids"])
    assert n_cut <= n_full - 60 and 0 < len(cut.lines) < len(full.lines)
    # the best lines inside the cue (LineConfig.per_cue of them) are the most needed: they survive the cut
    in_cue = [w for w in cut.lines if datetime(2023, 5, 1) <= w.start and w.end <= datetime(2023, 5, 8)]
    assert len(in_cue) >= PromptSettings().lines.per_cue
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        _input(PromptSettings(max_prompt_tokens=5), tokenizer=tok, store=store)


def test_long_questions_are_clipped():
    from tider.locator.prompt import question_block

    q = Query("q", "m", " ".join(f"w{i}" for i in range(100)), datetime(2023, 5, 10))
    assert question_block(q, "day", 64).splitlines()[0] == "Question: " + " ".join(f"w{i}" for i in range(64)) + " ..."


def test_schema_bounds_references_to_the_table_and_version_set():
    table = _input()
    schema = table.schema()
    n = len(table.lines)
    jsonschema.validate({"temporal": True, "windows": [{"entry": n}, {"cue": 1}, {"mark": "H1"}]}, schema)
    jsonschema.validate({"temporal": True, "windows": [{"start": "2023-05-01", "end": "2023-05-02"}]}, OUTPUT_SCHEMA)
    for bad in ({"entry": n + 1}, {"cue": 2}, {"entry": 0}, {"entry": 1, "cue": 1}, {"mark": "H9"}, {"mark": "C1"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"temporal": True, "windows": [bad]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"temporal": True, "windows": [], "extra": 1}, OUTPUT_SCHEMA)
    assert PROMPT_VERSION == "locator-v3"


def test_references_resolve_against_the_table_and_the_json_column():
    table = _input()
    n = len(table.lines)
    text = '{"temporal": true, "windows": [{"entry": 3}, {"cue": 1}]}'
    for refs in (table, table.refs_json("day"), Refs.of(table)):
        r = parse_prediction(text, granularity="day", refs=refs)
        assert r.ok
        line = table.lines[2]
        day_of_line = Window(
            line.start.replace(hour=0, minute=0), line.end.replace(hour=23, minute=59, second=59, microsecond=999999)
        )
        assert r.prediction.windows == tuple(sorted({day_of_line, WEEK}))
    bad = parse_prediction(f'{{"temporal": true, "windows": [{{"entry": {n + 1}}}]}}', granularity="day", refs=table)
    assert bad.failure is ParseFailure.BAD_REFERENCE and str(n + 1) in bad.detail
    no_table = parse_prediction('{"temporal": true, "windows": [{"cue": 1}]}', granularity="day")
    assert no_table.failure is ParseFailure.BAD_REFERENCE


def test_mark_answers_resolve_to_the_marked_line():
    from tider.locator.contract import LocatorContractError, LocatorMetadata
    from tider.train.examples import gold_answer

    table = _input()
    (k,) = [k for m, k in table.marks if m == "H1"]
    assert " H1" in _lines(table)[k - 1].split(" | ")[0]
    by_entry = parse_prediction(f'{{"temporal": true, "windows": [{{"entry": {k}}}]}}', granularity="day", refs=table)
    for refs in (table, table.refs_json("day"), Refs.of(table)):
        r = parse_prediction('{"temporal": true, "windows": [{"mark": "H1"}]}', granularity="day", refs=refs)
        assert r.ok and r.prediction == by_entry.prediction
    bad = parse_prediction('{"temporal": true, "windows": [{"mark": "A+7"}]}', granularity="day", refs=table)
    assert bad.failure is ParseFailure.BAD_REFERENCE and "A+7" in bad.detail
    # the gold answer names a line by its first mark
    q = _query(temporal=True, windows=(table.lines[k - 1],), evidence_ids=(1,))
    first = next(m for m, j in table.marks if j == k)
    assert gold_answer(q, table, "day")["windows"] == [{"mark": first}]
    # a gold window no line or cue touches cannot be pointed at: no window
    far = _query(temporal=True, windows=(Window(datetime(2022, 1, 1), datetime(2022, 1, 1)),), evidence_ids=(1,))
    assert gold_answer(far, table, "day") == {"temporal": False, "windows": []}
    LocatorMetadata(prompt_settings=PromptSettings().to_json()).validate("m")
    with pytest.raises(LocatorContractError, match="output_schema"):
        LocatorMetadata(output_schema={"type": "object"}).validate("m")


def test_options_answer_exactly_what_each_rule_answers():
    """Issue 45 item 1: the prompt lists the learning-free answers as options O1..O5, and
    {"option": n} resolves to exactly that source's windows (rules: padded cues with the cue
    as core; top-days; each top day) through the table and through the GRPO column."""
    from tider.locator.rules import RulesWindows, TimeCue
    from tider.locator.sources import make_source

    store = _store()
    table = _input(PromptSettings(options=True), store=store)
    text = table.messages[-1]["content"]
    listed = text.split("Options:\n")[1].split("\nTimeline:")[0].splitlines()
    assert [line.split(" = ")[0] for line in listed] == [
        "O1 rules",
        "O2 top-days",
        "O3 top-day 1",
        "O4 top-day 2",
        "O5 top-day 3",
    ]
    assert listed[0] == "O1 rules = 2023-05-01 .. 2023-05-07 (+1 day)" and '{"option"' in table.messages[0]["content"]

    class Cues(RulesWindows):  # the rules source on the cue the prompt was given
        def predict(self, query, store):
            from tider.types import WindowPrediction

            return WindowPrediction(
                True, tuple(sorted({c.window.widen(self.pad) for c in [TimeCue("last week", WEEK)]}))
            )

    public = _query().public()
    top_days = make_source("top-days").predict(public, store).windows
    top_day = make_source("top-day").predict(public, store).windows
    expected = {1: Cues().predict(public, store).windows, 2: top_days, 3: top_day}
    for refs in (table, table.refs_json("day")):
        for n, windows in expected.items():
            r = parse_prediction(f'{{"temporal": true, "windows": [{{"option": {n}}}]}}', granularity="day", refs=refs)
            assert r.ok and r.prediction.windows == windows, n
            assert [w.core for w in r.prediction.windows] == [w.core for w in windows]  # the pad stays a pad
    assert {w for n in (3, 4, 5) for w in table.options[n - 1]} == set(top_days)
    jsonschema.validate({"temporal": True, "windows": [{"option": 2}]}, table.schema())
    # no time expression: no rules option, and pointing at it is a bad reference
    plain = locator_input(
        Query("q3", "m1", "Which venue did we pick?", datetime(2023, 5, 10)), store, [], PromptSettings(options=True)
    )
    assert "O1 rules" not in plain.messages[-1]["content"] and "O2 top-days" in plain.messages[-1]["content"]
    bad = parse_prediction('{"temporal": true, "windows": [{"option": 1}]}', granularity="day", refs=plain)
    assert bad.failure is ParseFailure.BAD_REFERENCE


def test_a_checkpoint_from_before_options_is_prompted_without_them():
    from tider.locator.contract import LocatorMetadata, output_schema

    old = {k: v for k, v in PromptSettings().to_json().items() if k != "options"}
    settings = PromptSettings.from_json(old)
    assert settings.options is False
    table = _input(settings)
    assert "Options:" not in table.messages[-1]["content"] and "option" not in table.messages[0]["content"]
    assert table.options == () and "option" not in json.dumps(table.schema())
    LocatorMetadata(prompt_settings=old, output_schema=output_schema(marks=True, options=False)).validate("old")
    LocatorMetadata().validate("defaults")  # a --skip-check server: the default prompt and its schema


def test_removed_prompt_settings_read_at_their_shipped_values_only():
    shipped = {
        **PromptSettings().to_json(),
        "select": "structured",
        "show_cues": True,
        "pointers": True,
        "repeat_question": False,
        "marks": True,
    }
    assert PromptSettings.from_json(shipped) == PromptSettings()
    with pytest.raises(ValueError, match="'pointers' was removed.*fa11d15"):
        PromptSettings.from_json({**shipped, "pointers": False})


SPAN = Window(datetime(2023, 1, 1), datetime(2023, 12, 31, 18))


def test_parse_ok_with_think_block_prose_and_day_end():
    text = (
        'Let me see.<think>dates {"no": 1}</think> Sure: ```json\n{"temporal": true, "windows": '
        '[{"start": "2023-05-03", "end": "2023-05-04"}, {"start": "2023-01-01", "end": "2023-01-01"}]}\n```'
    )
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
