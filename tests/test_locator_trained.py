"""The ``locator`` window source (``tider.locator.trained``) with local transformers
generation: it prompts with the settings its ``tider_locator.json`` records, refuses to run
when they are unknown or disagree with the data's timeline (unless told), and maps every
completion to what the parser makes of it. An untrained tiny Qwen3 stands in for the
checkpoint here: its completions are malformed, so every query takes the fallback path;
tests/test_compare.py runs a locator whose predictions parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tider.locator.contract import METADATA_FILE, LocatorContractError, LocatorMetadata
from tider.locator.lines import LineConfig
from tider.locator.prompt import PromptSettings
from tider.locator.sources import make_source
from tider.types import NON_TEMPORAL

ROOT = Path(__file__).resolve().parents[1]
PROMPT = PromptSettings(LineConfig(max_lines=3), max_prompt_tokens=2000)
SETTINGS = {"prompt_settings": PROMPT.to_json(), "granularity": "day", "chat_template_kwargs": {}}


@pytest.fixture
def checkpoint(tiny_qwen3_dir, tmp_path):
    """A training-output layout: the weights in run/ckpt, the metadata in run/."""
    (tmp_path / "ckpt").symlink_to(tiny_qwen3_dir, target_is_directory=True)
    return tmp_path / "ckpt"


@pytest.fixture(scope="module")
def world():
    from tider.data.synth import generate
    from tider.memory import MemoryCollection

    ds = generate(200, seed=1, n_conversations=1)
    return ds, MemoryCollection(ds.memories)


def test_locator_source_needs_a_model_or_url(tmp_path):
    with pytest.raises(ValueError, match="model=PATH"):
        make_source("locator")
    with pytest.raises(ValueError, match="config.json"):
        make_source("locator", model=str(tmp_path))


def test_local_locator_predicts_or_falls_back_to_semantic(checkpoint, world):
    from tider.locator.parse import parse_prediction

    (checkpoint.parent / METADATA_FILE).write_text(json.dumps(SETTINGS))
    source = make_source("locator", model=str(checkpoint), max_tokens=24)
    assert source.settings == PROMPT and source.granularity == "day"
    ds, store = world
    queries = ds.queries[:5]
    memories = [ds.memories[q.memory_key] for q in queries]
    preds = source.predict_batch([q.public() for q in queries], store)
    failures = []
    for pred, outcome, table, memory in zip(preds, source.last_outcomes, source.last_inputs, memories):
        assert outcome.messages[1]["content"].count(" | L") == 3  # the recorded line count, not the default
        parsed = parse_prediction(outcome.text, granularity="day", refs=table, memory_span=memory.span)
        assert outcome.failure == (parsed.failure.value if parsed.failure else None)
        assert pred == (parsed.prediction if parsed.ok else NON_TEMPORAL)
        failures += [outcome.failure] if outcome.failure else []
    assert failures and dict(source.failures) == {f: failures.count(f) for f in set(failures)}


def test_mark_answers_parse_against_the_source_tables(checkpoint, world):
    """The source's tables carry the marks a ``{"mark"}`` answer resolves with."""
    from tider.locator.parse import parse_prediction

    (checkpoint.parent / METADATA_FILE).write_text(json.dumps(SETTINGS))
    source = make_source("locator", model=str(checkpoint), max_tokens=24)
    ds, store = world
    source.predict_batch([q.public() for q in ds.queries[:5]], store)
    tables = [t for t in source.last_inputs if t.marks]
    assert tables
    label, k = tables[0].marks[0]
    r = parse_prediction(
        json.dumps({"temporal": True, "windows": [{"mark": label}]}), granularity="day", refs=tables[0]
    )
    assert r.ok and r.prediction.windows[0].start.date() == tables[0].lines[k - 1].start.date()


def test_a_vote_keeps_the_windows_enough_samples_name():
    from datetime import datetime

    from tider.locator.chat_source import LocatorOutcome, vote
    from tider.types import Window, WindowPrediction

    day = [Window(datetime(2024, 1, d), datetime(2024, 1, d)) for d in (1, 2, 3)]
    answers = [
        LocatorOutcome("a", WindowPrediction(True, (day[0],))),
        LocatorOutcome("b", WindowPrediction(True, (day[1], day[0], day[0]))),  # a repeat is one vote
        LocatorOutcome("c", WindowPrediction(True, (day[2], day[1]))),
        LocatorOutcome("d", NON_TEMPORAL),
        LocatorOutcome("e", None, "no_json"),  # votes for nothing
    ]
    union = vote(answers, 1)
    assert union.prediction.windows == (day[0], day[1], day[2])  # most named first
    assert union.failure is None and union.detail == "1 of 5 samples unparsed" and union.text.count("\n") == 4
    assert vote(answers, 2).prediction.windows == (day[0], day[1])
    assert vote(answers, 3).prediction == NON_TEMPORAL  # no window enough samples agree on
    failed = vote([LocatorOutcome("x", None, "no_json", "no JSON object"), LocatorOutcome("y", None, "schema")], 1)
    assert (failed.prediction, failed.failure, failed.detail) == (None, "no_json", "no JSON object")


def test_the_recorded_decoding_draws_the_answer(checkpoint, world):
    """A locator whose contract says "vote of 3 samples" asks 3 sampled completions a query,
    in one request (num_return_sequences locally), at the recorded temperature; an invalid
    decoding is refused naming the file."""
    from tider.locator.contract import Decoding

    ds, store = world
    vote3 = {"samples": 3, "temperature": 0.7, "min_votes": 2}
    (checkpoint.parent / METADATA_FILE).write_text(json.dumps({**SETTINGS, "decoding": vote3}))
    source = make_source("locator", model=str(checkpoint), max_tokens=8)
    assert source.decoding == Decoding(**vote3) and source.describe()["decoding"] == vote3
    source.predict_batch([q.public() for q in ds.queries[:2]], store)
    usage = source.client.usage_by_stage()["locator"]
    assert (usage["calls"], usage["samples"]) == (2, 6)
    greedy = make_source("locator", model=str(checkpoint), max_tokens=8, decoding={})  # an explicit override
    assert greedy.decoding == Decoding()
    with pytest.raises(ValueError, match="need a temperature > 0"):
        Decoding(samples=2, temperature=0)
    (checkpoint.parent / METADATA_FILE).write_text(json.dumps({**SETTINGS, "decoding": {"samples": 2, "min_votes": 3}}))
    with pytest.raises(LocatorContractError, match=r"ckpt: decoding .* 1 <= min_votes <= samples"):
        make_source("locator", model=str(checkpoint))


def test_unknown_settings_are_refused_unless_allowed(checkpoint, world):
    with pytest.raises(LocatorContractError, match="no tider_locator.json .* allow_unknown_settings"):
        make_source("locator", model=str(checkpoint))
    source = make_source("locator", model=str(checkpoint), allow_unknown_settings=True)
    assert source.settings == PromptSettings() and source.granularity is None  # the prompt defaults
    (checkpoint.parent / METADATA_FILE).write_text(json.dumps({"granularity": "day"}))
    with pytest.raises(LocatorContractError, match="records no prompt_settings, chat_template_kwargs"):
        make_source("locator", model=str(checkpoint))
    (checkpoint.parent / METADATA_FILE).write_text(json.dumps({**SETTINGS, "prompt_version": "locator-v1"}))
    with pytest.raises(
        LocatorContractError, match="prompt version 'locator-v1' does not match this code's 'locator-v3'"
    ):
        make_source("locator", model=str(checkpoint), allow_unknown_settings=True)  # never allowed


def test_metadata_can_be_given_explicitly(checkpoint, tmp_path):
    elsewhere = tmp_path / "copied" / METADATA_FILE
    elsewhere.parent.mkdir()
    five = PromptSettings(LineConfig(max_lines=5)).to_json()
    elsewhere.write_text(json.dumps({**SETTINGS, "prompt_settings": five}))
    source = make_source("locator", model=str(checkpoint), metadata=str(elsewhere))
    assert source.settings.lines.max_lines == 5 and source.metadata.prompt_settings == five


def test_a_store_building_other_timelines_is_refused(checkpoint, world):
    from dataclasses import replace

    from tider.locator.contract import input_settings
    from tider.memory import MemoryCollection
    from tider.retrieval.config import RetrievalConfig

    ds, store = world
    LocatorMetadata(**SETTINGS, **input_settings(store.config)).write(checkpoint.parent)
    assert make_source("locator", model=str(checkpoint), store=store).settings == PROMPT  # same timeline: fine
    other = MemoryCollection(
        ds.memories,
        RetrievalConfig(timeline=replace(RetrievalConfig().timeline, theta_sem=0.85), embed_template="{text}"),
    )
    with pytest.raises(LocatorContractError, match=r"timeline.theta_sem: trained 0.35, now 0.85; embed_template"):
        make_source("locator", model=str(checkpoint), store=other)
    assert make_source("locator", model=str(checkpoint), store=other, allow_unknown_settings=True)


def test_metadata_round_trips_and_names_bad_files(tmp_path):
    meta = LocatorMetadata(**SETTINGS, dataset_name="synthetic")
    path = meta.write(tmp_path)
    assert LocatorMetadata.read(path) == meta == LocatorMetadata.find(tmp_path / "checkpoint-3")
    assert LocatorMetadata.find(tmp_path / "a" / "b") is None
    path.write_text("[1, 2]")
    with pytest.raises(LocatorContractError, match="expected a JSON object, got list"):
        LocatorMetadata.read(path)
    path.write_text(json.dumps({**SETTINGS, "field_from_a_newer_tider": 1}))
    assert LocatorMetadata.read(tmp_path).prompt_settings == PROMPT.to_json()  # unknown keys are ignored


def test_removed_settings_load_at_their_shipped_value_and_name_their_last_commit(tmp_path):
    """A locator-v2 checkpoint's metadata (tests/data: the former shipped start's) records
    timeline.summary_words (16), an option removed since:
    it still reads and matches today's timeline (its prompt version is checked separately);
    another value is refused, naming the option and the last commit that had it."""
    from tider.locator.contract import REMOVED_SETTINGS, input_settings
    from tider.retrieval.config import RetrievalConfig

    shipped = ROOT / "tests" / "data" / "tider_locator_v2.json"
    raw = json.loads(shipped.read_text())
    assert raw["timeline"]["summary_words"] == REMOVED_SETTINGS["timeline.summary_words"][0]
    meta = LocatorMetadata.read(shipped)
    assert "summary_words" not in meta.timeline and meta.timeline == input_settings(RetrievalConfig())["timeline"]
    assert meta.input_mismatches(RetrievalConfig()) == []
    raw["timeline"]["summary_words"] = 24
    (tmp_path / METADATA_FILE).write_text(json.dumps(raw))
    with pytest.raises(LocatorContractError, match=r"timeline\.summary_words is 24, .* no longer has .* fa11d15"):
        LocatorMetadata.read(tmp_path)


def test_removed_settings_are_gone_from_the_code():
    from dataclasses import asdict

    from tider.locator.contract import REMOVED_SETTINGS
    from tider.retrieval.config import TimelineConfig

    current = {"timeline": asdict(TimelineConfig()), "prompt_settings": PromptSettings().to_json()}
    for path, (_, commit) in REMOVED_SETTINGS.items():
        section, key = path.split(".")
        assert key not in current[section], path
        assert len(commit) == 7 and int(commit, 16) >= 0, commit
