import re
from collections import Counter
from datetime import date, timedelta

import pytest

from tider.data import load_dataset
from tider.data.stats import dataset_stats
from tider.data.synth import EVENTS, default_dataset, generate, write
from tider.data.synth_queries import AFTER, BEFORE, CURRENT, MONTHS, RELATIVE, relative_period

ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
QUERY_TYPES = {"absolute", "relative", "vague", "anchored", "multi2", "multi3", "current_state", "non_temporal"}


@pytest.fixture(scope="module")
def data():
    return default_dataset(seed=0)


def window_days(query):
    return [(w.start.date(), w.end.date()) for w in query.gold.windows]


def test_default_shape():
    # Generation speed is measured by bench/bench_synth.py, not bounded here.
    data = default_dataset(seed=3)
    assert len(data.memories) == 16 and data.granularity == "day"
    for key, memory in data.memories.items():
        assert 1200 <= len(memory) <= 1600
        assert len({m.speaker for m in memory}) >= 4  # multi-party
        assert (memory.span.end - memory.span.start).days >= 300  # about a year, not days
        per_conv = sum(q.memory_key == key for q in data.queries)
        assert 150 <= per_conv <= 300
    assert set(data.stats["query_types"]) == QUERY_TYPES
    stats = dataset_stats(data)
    assert all(stats["by_window_bucket"][b] > 30 for b in ("0", "1", "2", ">=3"))


def test_deterministic_by_seed(tmp_path):
    a, b, c = (
        generate(800, seed=5, n_conversations=2),
        generate(800, seed=5, n_conversations=2),
        generate(800, seed=6, n_conversations=2),
    )
    assert [(q.key, q.text, q.asked_at, q.gold) for q in a.queries] == [
        (q.key, q.text, q.asked_at, q.gold) for q in b.queries
    ]
    assert [q.text for q in a.queries] != [q.text for q in c.queries]
    write(a, tmp_path / "a")
    write(b, tmp_path / "b")
    for name in ("messages.jsonl", "queries.jsonl", "dataset.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_written_benchmark_loads_back_identically(tmp_path):
    original = generate(600, seed=2, n_conversations=3)
    write(original, tmp_path / "synth")
    loaded = load_dataset("synthetic", str(tmp_path / "synth"))
    assert loaded.name == "synthetic" and loaded.stats["query_types"] == original.stats["query_types"]
    assert [(q.key, q.text, q.asked_at, q.user, q.category, q.gold) for q in loaded.queries] == [
        (q.key, q.text, q.asked_at, q.user, q.category, q.gold) for q in original.queries
    ]
    assert {k: list(m) for k, m in loaded.memories.items()} == {k: list(m) for k, m in original.memories.items()}


def test_metadata_chains_and_filler(data):
    messages = [m for memory in data.memories.values() for m in memory]
    assert {m.channel for m in messages} >= {"#general", "#events", "#projects"}
    assert {m.phase for m in messages if m.stage is not None} == {"proposal", "revision", "rollback"}
    assert Counter(m.topic for m in messages)["chatter"] > len(messages) // 8
    for memory in data.memories.values():  # every chain runs forward in time
        chains = {}
        for m in memory:
            if m.stage is not None:
                chains.setdefault(re.sub(r" to .*$", "", m.text.split(": ", 1)[1]).split(" ", 1)[1], []).append(m.stage)
        assert all(stages == list(range(len(stages))) for stages in chains.values())


def test_gold_windows_hold_the_evidence(data):
    temporal = 0
    for q in data.queries:
        memory = data.memory_of(q)
        assert q.gold.evidence_ids and q.gold.answer
        assert q.gold.temporal == (q.category != "non_temporal")
        if q.gold.temporal:
            assert all(any(w.contains(memory[i].timestamp) for w in q.gold.windows) for i in q.gold.evidence_ids)
            assert all(q.gold.answer.split("; ")[0] in memory[i].text for i in q.gold.evidence_ids[:1])
            temporal += 1
    assert 0 < temporal < len(data.queries)  # both kinds checked


def _event(text: str) -> str:
    return max((e for e in EVENTS if e in text), key=len)


def _instance_days(memory, event: str) -> list:
    return sorted({m.timestamp.date() for m in memory if m.text.endswith(f"as the {EVENTS[event][0]} at the {event}")})


def _template_regex(template: str) -> re.Pattern:
    return re.compile(
        re.escape(template).replace(re.escape("{e}"), "(?P<e>[a-z ]+?)").replace(re.escape("{m}"), "(?P<m>[a-z0-9 ]+)")
    )


def test_every_phrasing_occurs(data):
    texts = [q.text for q in data.queries]
    for phrase in RELATIVE:
        assert any(f" {phrase}?" in t or f" {phrase}," in t for t in texts), phrase
    for template in AFTER + BEFORE:
        assert any(_template_regex(template).search(t) for t in texts), template
    for template in CURRENT:
        head = template.split("{")[0]
        assert any(t.startswith(head) for t in texts if "project" in t), template
    assert sum(bool(ISO_DATE.search(t)) for t in texts) > 100  # and dates in other formats
    assert sum(any(f" on {m} " in t or f" on {m}," in t or f" of {m}" in t for m in MONTHS) for t in texts) > 100


def test_relative_questions_name_exactly_one_instance(data):
    checked = Counter()
    for q in data.queries:
        if q.category != "relative":
            continue
        phrase = next(p for p in sorted(RELATIVE, key=len, reverse=True) if f" {p}" in q.text)
        lo, hi = relative_period(q.asked_at.date(), phrase)
        days = _instance_days(data.memory_of(q), _event(q.text))
        assert [d for d in days if lo <= d <= hi] == [window_days(q)[0][0]], (q.text, q.asked_at)
        assert q.asked_at.date() > window_days(q)[0][0]
        checked[phrase] += 1
    assert set(checked) == set(RELATIVE)


def test_anchored_questions_name_exactly_one_instance(data):
    checked = Counter()
    for q in data.queries:
        if q.category != "anchored":
            continue
        memory = data.memory_of(q)
        for direction, templates in (
            ("after", AFTER),
            ("before", BEFORE),
            ("week", ["the {e} in the week of the {m}"]),
        ):
            match = next((r.search(q.text) for r in map(_template_regex, templates) if r.search(q.text)), None)
            if match:
                break
        assert match, q.text
        anchor = next(
            m.timestamp.date() for m in memory if m.text == f"big news: the {match.group('m')} happened today"
        )
        days = _instance_days(memory, _event(q.text))
        if direction == "after":
            expected = next(d for d in days if d > anchor)
        elif direction == "before":
            expected = [d for d in days if d < anchor][-1]
        else:
            monday = anchor - timedelta(days=anchor.weekday())
            (expected,) = [d for d in days if monday <= d <= monday + timedelta(days=6)]
        assert window_days(q)[0][0] == expected, q.text
        checked[direction] += 1
    assert min(checked.values()) > 10 and len(checked) == 3


def test_dated_questions_carry_their_dates(data):
    checked = Counter()
    for q in data.queries:
        if q.category in ("absolute", "multi2", "multi3") and ISO_DATE.search(q.text):
            stated = [date.fromisoformat(d) for d in ISO_DATE.findall(q.text)]
            assert window_days(q) == [(d, d) for d in stated]
            assert len(stated) == {"absolute": 1, "multi2": 2, "multi3": 3}[q.category]
            checked[q.category] += 1
    assert set(checked) == {"absolute", "multi2", "multi3"} and min(checked.values()) > 50, checked


def test_conversations_share_one_calendar_period(data):
    # A held-out conversation must not need dates the training conversations never show.
    starts = {memory.span.start.date() for memory in data.memories.values()}
    ends = {memory.span.end.date() for memory in data.memories.values()}
    assert len(starts) <= 3 and (max(starts) - min(starts)).days <= 3
    assert (max(ends) - min(ends)).days <= 14


def test_twins_outnumber_the_retrieval_cutoff(data):
    # The benchmark's point: for a single-instance question about a frequent event, the
    # near-identical reports from other days far exceed k=20, so only the time cue finds it.
    def template(text):
        return re.sub(r"^we picked \S+ as", "we picked _ as", text)

    crowded = []
    for q in data.queries:
        if q.category not in ("absolute", "relative", "anchored"):
            continue
        memory = data.memory_of(q)
        gold = template(memory[q.gold.evidence_ids[0]].text)
        crowded.append(sum(template(m.text) == gold for m in memory) > 2 * 20)
    assert sum(crowded) > 0.6 * len(crowded)


def test_distractors_are_near_identical_and_temporally_wrong(data):
    def template(text):
        return re.sub(r"^we picked \S+ as", "we picked _ as", text)

    checked = 0
    for q in data.queries:
        if q.category in ("current_state", "non_temporal"):
            continue
        memory = data.memory_of(q)
        gold = memory[q.gold.evidence_ids[0]]
        assert template(gold.text) != gold.text
        # Same words but the detail, on days outside every gold window.
        twins = [
            m
            for m in memory
            if template(m.text) == template(gold.text) and not any(w.contains(m.timestamp) for w in q.gold.windows)
        ]
        assert twins, q.text
        checked += 1
    assert checked > 1000


def test_current_state_follows_the_latest_update(data):
    checked = checked_mid = 0
    for q in data.queries:
        if q.category != "current_state":
            continue
        memory = data.memory_of(q)
        param, project = re.search(r"(database|region|owner|deadline) (?:of|for|is) project (\w+)", q.text).groups()
        steps = [m for m in memory if m.stage is not None and f"the {param} of project {project} to " in m.text]
        known = [m for m in steps if m.timestamp < q.asked_at]  # updates after asked_at do not exist yet
        assert len(known) >= 2 and q.gold.evidence_ids == (known[-1].id,)
        assert known[-1].text.endswith(f" to {q.gold.answer}")
        checked_mid += known[-1].id != steps[-1].id
        checked += 1
    assert checked > 30 and checked_mid > 10


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="n_conversations"):
        generate(3, n_conversations=4)


def test_small_sizes_still_work():
    tiny = generate(60, seed=1, n_conversations=1)
    assert len(next(iter(tiny.memories.values()))) >= 60 and tiny.queries
    dated = [q for q in tiny.queries if q.gold.windows]
    assert dated and all(q.asked_at - timedelta(days=400) < q.gold.windows[0].start for q in dated)


@pytest.mark.parametrize("n_messages, n_conversations, seed", [(150, 1, 0), (1000, 4, 11), (3000, 2, 7)])
def test_invariants_at_other_sizes(n_messages, n_conversations, seed):
    data = generate(n_messages, seed=seed, n_conversations=n_conversations)
    assert sum(len(m) for m in data.memories.values()) == n_messages
    assert data.queries and len({q.key for q in data.queries}) == len(data.queries)
    for memory in data.memories.values():
        assert [m.id for m in memory] == list(range(len(memory)))
        assert memory.timestamps == sorted(memory.timestamps)
        assert len({m.key for m in memory}) == len(memory)
    for q in data.queries:
        memory = data.memory_of(q)
        assert (
            all(any(w.contains(memory[i].timestamp) for w in q.gold.windows) for i in q.gold.evidence_ids)
            or not q.gold.temporal
        )
        assert q.user in {m.speaker for m in memory}
