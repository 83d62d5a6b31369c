import json
from datetime import datetime
from pathlib import Path

import pytest

from tider.data import LOCOMO_CATEGORIES, DatasetError, load_dataset
from tider.data.locomo import LOCOMO_ADVERSARIAL_ANSWER
from tider.data.stats import dataset_stats

DEV = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "locomo" / "locomo_dev.json"


def turn(dia_id, text, speaker="Ann", **extra):
    return {"speaker": speaker, "dia_id": dia_id, "text": text, **extra}


def conversation():
    """A small conversation with every LoCoMo quirk the loader must handle."""
    return {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [turn("D1:1", "I joined a choir."), turn("D1:2", "Nice!", "Bo")],
            # Session 2 is stored before session 1's neighbour and its turns carry D9 ids:
            # evidence must be found by dia_id, not by the D-number as a session index.
            "session_2_date_time": "10:00 am on 20 May, 2023",
            "session_2": [
                turn("D9:1", "", blip_caption="a photo of a red bike"),
                turn("D9:2", "We met at the lake.", date_time="29.12.2023, 22:42:04"),
            ],
            "session_3_date_time": "9:15 am on 21 May, 2023",  # no session_3: ignored
        },
        "qa": [
            {"question": "When did Ann join a choir?", "answer": "8 May 2023", "evidence": ["D1:1"], "category": 2},
            {"question": "What year?", "answer": 2023, "evidence": ["D1:1; D9:2"], "category": 1},
            {"question": "Spaces?", "answer": "x", "evidence": ["D1:2 D9:1"], "category": 4},
            {"question": "Broken refs?", "answer": "y", "evidence": ["D", "D:9:1", "D7:7"], "category": 3},
            {
                "question": "Did Bo sing?",
                "adversarial_answer": "yes, at the choir",
                "evidence": ["D1:2"],
                "category": 5,
            },
            {"question": "No evidence?", "answer": "z", "evidence": [], "category": 4},
        ],
    }


def write(tmp_path, data, name="locomo.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def fixture_dataset(tmp_path):
    return load_dataset("locomo", str(write(tmp_path, [conversation()])))


def test_session_times_turn_times_and_ignored_date_keys(fixture_dataset):
    memory = fixture_dataset.memories["conv-x"]
    times = {m.key: m.timestamp for m in memory}
    assert times["D1:1"] == datetime(2023, 5, 8, 13, 56)
    assert times["D9:1"] == datetime(2023, 5, 20, 10, 0)
    assert times["D9:2"] == datetime(2023, 12, 29, 22, 42, 4)  # the turn's own date_time wins
    assert memory.sessions == ["session_1", "session_2"]
    assert [m.key for m in memory] == ["D1:1", "D1:2", "D9:1", "D9:2"]  # time order, ids = positions
    assert fixture_dataset.stats["sessions_without_turns"] == 1
    assert fixture_dataset.stats["turns_with_own_time"] == 1


def test_image_turns_are_rendered_as_text(fixture_dataset):
    memory = fixture_dataset.memories["conv-x"]
    assert memory[memory.id_of("D9:1")].text == "[image: a photo of a red bike]"
    assert fixture_dataset.stats["image_turns"] == 1


def test_irregular_and_missing_evidence_is_split_repaired_or_counted(fixture_dataset):
    memory = fixture_dataset.memories["conv-x"]
    q = {query.text: query for query in fixture_dataset.queries}
    assert q["What year?"].gold.evidence_ids == (memory.id_of("D1:1"), memory.id_of("D9:2"))
    assert q["Spaces?"].gold.evidence_ids == (memory.id_of("D1:2"), memory.id_of("D9:1"))
    broken = q["Broken refs?"].gold
    assert broken.evidence_ids == (memory.id_of("D9:1"),)  # "D:9:1" repaired
    assert broken.unresolved_evidence == ("D", "D7:7")
    assert fixture_dataset.stats["unresolved_evidence"] == 2
    assert fixture_dataset.stats["repaired_evidence"] == 1
    assert dataset_stats(fixture_dataset)["unresolved_evidence"] == 2


def quirk_conversation(evidence):
    """Two dialogues of five turns each, one question per evidence list."""
    return {
        "sample_id": "conv-q",
        "conversation": {
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [turn(f"D12:{i}", f"turn {i} of twelve") for i in range(1, 6)],
            "session_2_date_time": "10:00 am on 20 May, 2023",
            "session_2": [turn(f"D13:{i}", f"turn {i} of thirteen") for i in range(1, 6)],
        },
        "qa": [{"question": f"q{i}", "answer": "a", "evidence": e, "category": 2} for i, e in enumerate(evidence)],
    }


@pytest.mark.parametrize(
    "evidence, resolved, quirk",
    [
        (["D12:3-D12:5"], ["D12:3", "D12:4", "D12:5"], "range"),
        (["D12:2 - D12:3"], ["D12:2", "D12:3"], "range"),
        (["D13:2-4"], ["D13:2", "D13:3", "D13:4"], "range"),
        (["D12:3."], ["D12:3"], "trailing_punctuation"),
        (["D13:5;"], ["D13:5"], None),  # a separator, not a quirk
        (["(D12:1)"], ["D12:1"], "trailing_punctuation"),
        (["D12:4:D13:1"], ["D12:4", "D13:1"], "joined_refs"),
        (["D:12:2"], ["D12:2"], "repaired_colon"),
    ],
)
def test_evidence_quirks_that_are_unambiguous_resolve(tmp_path, evidence, resolved, quirk):
    data = load_dataset("locomo", str(write(tmp_path, [quirk_conversation([evidence])])))
    memory, [q] = data.memories["conv-q"], data.queries
    assert q.gold.evidence_ids == tuple(sorted(memory.id_of(r) for r in resolved))
    assert q.gold.unresolved_evidence == () and data.stats["unresolved_by_kind"] == {}
    assert data.stats["evidence_quirks"] == ({quirk: 1} if quirk else {})


@pytest.mark.parametrize(
    "evidence, kind",
    [
        (["14"], "bare_number"),
        (["D12:4-D13:2"], "cross_dialogue_range"),
        (["D12:5-D12:3"], "cross_dialogue_range"),  # backwards: which turns were meant?
        (["D12:4-D12:9"], "no_such_turn"),  # runs past the dialogue's last turn
        (["D14:1"], "no_such_turn"),
        (["D"], "malformed"),
        (["see D12"], "malformed"),
    ],
)
def test_ambiguous_evidence_is_dropped_and_counted_by_kind(tmp_path, evidence, kind):
    data = load_dataset("locomo", str(write(tmp_path, [quirk_conversation([evidence, ["D12:1"]])])))
    broken, fine = data.queries
    assert broken.gold.evidence_ids == () and broken.gold.unresolved_evidence
    assert fine.gold.evidence_ids == (data.memories["conv-q"].id_of("D12:1"),)  # one bad ref loses nothing else
    assert data.stats["unresolved_by_kind"] == {kind: len(broken.gold.unresolved_evidence)}
    assert dataset_stats(data)["unresolved_evidence"] == len(broken.gold.unresolved_evidence)


def test_data_stats_prints_the_quirk_counts(tmp_path, capsys):
    from tider.cli import main

    path = write(tmp_path, [quirk_conversation([["D12:1-3", "14"], ["D12:4:D13:1", "D9:1"]])])
    assert main(["data", "stats", "--dataset", "locomo", "--path", str(path), "--json"]) == 0
    loader = json.loads(capsys.readouterr().out)["loader"]
    assert loader["evidence_quirks"] == {"joined_refs": 1, "range": 1}
    assert loader["unresolved_by_kind"] == {"bare_number": 1, "no_such_turn": 1}
    assert main(["data", "stats", "--dataset", "locomo", "--path", str(path)]) == 0
    table = capsys.readouterr().out
    assert "loader: unresolved_by_kind" in table and '"bare_number": 1' in table


def test_answers_categories_asked_at_and_gold_windows(fixture_dataset):
    q = {query.text: query for query in fixture_dataset.queries}
    assert q["What year?"].gold.answer == "2023"
    adversarial = q["Did Bo sing?"]
    assert adversarial.category == "5" and LOCOMO_CATEGORIES[adversarial.category] == "adversarial"
    assert adversarial.gold.answer == LOCOMO_ADVERSARIAL_ANSWER
    assert adversarial.gold.adversarial_answer == "yes, at the choir"
    assert all(query.asked_at == datetime(2023, 12, 29, 22, 42, 4) and query.user is None for query in q.values())
    assert [w.to_json("day") for w in q["What year?"].gold.windows] == [
        {"start": "2023-05-08", "end": "2023-05-08"},
        {"start": "2023-12-29", "end": "2023-12-29"},
    ]
    assert q["No evidence?"].gold.temporal is False and q["No evidence?"].gold.windows == ()
    assert q["When did Ann join a choir?"].gold.temporal is True
    assert q["When did Ann join a choir?"].public().gold.evidence_ids == ()


def test_non_temporal_categories_option(tmp_path):
    data = load_dataset("locomo", str(write(tmp_path, [conversation()])), non_temporal_categories=("5",))
    adversarial = next(q for q in data.queries if q.category == "5")
    assert adversarial.gold.temporal is False and adversarial.gold.evidence_ids  # evidence kept for coverage


@pytest.mark.parametrize(
    "mutate, record, problem",
    [
        (
            lambda c: c["conversation"].__setitem__("session_1_date_time", "sometime in spring"),
            "conv-x session_1_date_time",
            "unparseable timestamp",
        ),
        (
            lambda c: c["conversation"]["session_2"][1].__setitem__("date_time", "99.99.2023, 25:00:00"),
            "conv-x session_2 turn 1 (D9:2) date_time",
            "unparseable timestamp",
        ),
        (lambda c: c["conversation"]["session_1"][0].pop("dia_id"), "conv-x session_1 turn 0", "missing key 'dia_id'"),
        (lambda c: c["qa"][0].pop("question"), "conv-x qa[0]", "missing key 'question'"),
        (lambda c: c["qa"][0].pop("answer"), "conv-x qa[0]", "missing key 'answer'"),
        (lambda c: c.pop("qa"), "sample 0", "missing key 'qa'"),
    ],
)
def test_malformed_records_name_file_and_record(tmp_path, mutate, record, problem):
    data = conversation()
    mutate(data)
    path = write(tmp_path, [data])
    with pytest.raises(DatasetError) as info:
        load_dataset("locomo", str(path))
    assert str(path) in str(info.value) and record in str(info.value) and problem in str(info.value)


def test_truncated_json_names_file_and_position(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(json.dumps([conversation()])[:300])
    with pytest.raises(DatasetError, match=r"cut\.json: line 1 column \d+: invalid JSON"):
        load_dataset("locomo", str(path))
    with pytest.raises(DatasetError, match="not found"):
        load_dataset("locomo", str(tmp_path / "missing.json"))


def test_unknown_dataset_lists_known_names():
    with pytest.raises(ValueError, match="known: \\['jsonl', 'locomo', 'longmemeval', 'realmem', 'synthetic'\\]"):
        load_dataset("locomo2", "x")


@pytest.mark.skipif(not DEV.exists(), reason="LoCoMo dev copy (../shared) not present")
def test_real_locomo_dev_counts():
    data = load_dataset("locomo", str(DEV))
    stats = dataset_stats(data)
    assert stats["conversations"] == 7 and stats["queries"] == 1347 and stats["messages"] == 4124
    assert stats["by_category"] == {"1": 192, "2": 214, "3": 66, "4": 563, "5": 312}
    # Explicitly counted broken refs in the dev copy: "D" (conv-42) and the turns
    # D10:19 (conv-42) and D4:36 (conv-47) that do not exist; "D:11:26" is repaired and
    # "D8:6; D9:17" split, so both resolve.
    assert stats["unresolved_evidence"] == 3
    assert stats["loader"]["repaired_evidence"] == 1 and stats["loader"]["split_evidence"] == 1
    assert stats["loader"]["evidence_quirks"] == {"repaired_colon": 1}
    assert stats["loader"]["unresolved_by_kind"] == {"malformed": 1, "no_such_turn": 2}
    # Two questions have no evidence at all: the only non-temporal ones by default.
    assert stats["by_window_bucket"]["0"] == 2 and stats["temporal_queries"] == 1345
    for q in data.queries:  # every resolved ref is a real turn inside a gold window
        memory = data.memory_of(q)
        assert all(any(w.contains(memory[i].timestamp) for w in q.gold.windows) for i in q.gold.evidence_ids)
