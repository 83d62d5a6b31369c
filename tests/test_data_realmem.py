"""The RealMem loader: time order, turn-level evidence, the cut at each query, bad input."""

import json
from collections import Counter
from pathlib import Path

import pytest

from tider.data import DatasetError, load_dataset
from tider.data.stats import dataset_stats

REALMEM = Path(__file__).resolve().parents[2] / "shared" / "data" / "realmem"


def turn(speaker, content, **extra):
    return {"speaker": speaker, "is_query": False, "content": content, "query_id": None, **extra}


def query(content, qid, category="Dynamic Incremental"):
    return turn("User", content, is_query=True, query_id=qid, category_name=category)


def reply(content, points=(), sessions=()):
    return turn(
        "Assistant",
        content,
        memory_used=[{"session_uuid": s, "content": c} for s, c in points],
        memory_session_uuids=list(sessions),
    )


def point(index, content, source_turn, snapshot, uuid):
    return {
        "index": index,
        "type": "Dynamic",
        "content": content,
        "source_turn": source_turn,
        "source_content_snapshot": snapshot,
        "source_role_snapshot": "User",
        "session_uuid": uuid,
    }


def persona():
    """Three sessions: s2 is dated before s1 but comes after it in the file; s3 shares
    s1's day and comes after it in the file. s3's queries use every kind of evidence."""
    s1 = {
        "session_identifier": "Travel:S1_01",
        "session_uuid": "s1",
        "current_time": "2026-01-05 (Monday)",
        "dialogue_turns": [
            turn("User", "I want to visit Kyoto in April."),
            turn("Assistant", "Noted: Kyoto."),
            turn("User", "My budget is 2000 dollars."),
            turn("Assistant", "Noted the budget."),
        ],
        "extracted_memory": [
            point("m1", "Trip: Kyoto in April", 1, "I want to visit Kyoto in April.", "s1"),
            point("m2", "Budget 2000", 2, "My budget is 2000 dollars.", "s1"),
            point("m3", "Unmatched snapshot", 1, "text that is in no turn", "s1"),
        ],
    }
    s2 = {
        "session_identifier": "Fitness:S1_01",
        "session_uuid": "s2",
        "current_time": "2026-01-02 (Friday)",
        "dialogue_turns": [turn("User", "I run on Tuesdays."), turn("Assistant", "Great.")],
        "extracted_memory": [point("m4", "Runs on Tuesdays", 0, "I run on Tuesdays.", "s2")],
    }
    s3 = {
        "session_identifier": "Travel:S2_01",
        "session_uuid": "s3",
        "current_time": "2026-01-05 (Monday)",
        "dialogue_turns": [
            query("What was my budget again?", "Q-1"),
            reply("2000 dollars.", [("s1", "Budget 2000"), ("s2", "Runs on Tuesdays"), ("s1", "Unmatched snapshot")]),
            query("And the plan?", "Q-2"),
            reply("Kyoto; see you next week.", [("s4", "Later session")]),
            query("Anything else?", "Q-3"),
            reply("Only the sessions.", sessions=["s2"]),
        ],
        "extracted_memory": [],
    }
    s4 = {
        "session_identifier": "Travel:S3_01",
        "session_uuid": "s4",
        "current_time": "2026-01-09 (Friday)",
        "dialogue_turns": [turn("User", "Booked the flight."), turn("Assistant", "Good.")],
        "extracted_memory": [point("m5", "Later session", 1, "Booked the flight.", "s4")],
    }
    return {"_metadata": {"person_name": "Ann_Example", "total_sessions": 4}, "dialogues": [s1, s2, s3, s4]}


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "Ann_Example_dialogues_256k.json"
    path.write_text(json.dumps(persona()))
    return load_dataset("realmem", str(path))


def test_messages_in_day_then_file_order_each_with_its_own_instant(dataset):
    memory = dataset.memories["Ann_Example"]
    assert [m.key for m in memory][:4] == ["s2:0", "s2:1", "s1:0", "s1:1"]  # s2 is dated first
    assert [m.session for m in memory] == ["s2"] * 2 + ["s1"] * 4 + ["s3"] * 6 + ["s4"] * 2
    stamps = [m.timestamp for m in memory]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert {m.timestamp.date().isoformat() for m in memory if m.session in ("s1", "s3")} == {"2026-01-05"}
    assert dataset.stats["sessions_dated_before_the_previous"] == 1


def test_query_sees_only_what_came_before_it(dataset):
    memory = dataset.memories["Ann_Example"]
    q1, q2, _q3 = dataset.queries
    assert (q1.key, q1.user, q1.category) == ("Ann_Example:Q-1", "User", "Dynamic Incremental")
    visible = [m.key for m in memory if m.timestamp <= q1.asked_at]
    assert visible[-1] == "s1:3" and "s3:0" not in visible  # the question and its answer are not memory
    assert q1.gold.answer == "2000 dollars."
    assert q2.asked_at > q1.asked_at and q2.asked_at.date() == q1.asked_at.date()


def test_evidence_is_the_source_turn_or_else_the_whole_session(dataset):
    memory = dataset.memories["Ann_Example"]
    q1, _q2, q3 = dataset.queries
    keys = {memory[i].key for i in q1.gold.evidence_ids}
    # "Budget 2000" (source_turn 2): 1-based that is s1:1, not the snapshot; 0-based it is s1:2.
    # "Runs on Tuesdays" (source_turn 0): 0-based. The unmatched snapshot: all of s1.
    assert keys == {"s1:0", "s1:1", "s1:2", "s1:3", "s2:0"}
    assert [w.start.date().isoformat() for w in q1.gold.windows] == ["2026-01-02", "2026-01-05"]
    counts = Counter(dataset.stats["evidence_turns"])
    # Q-2's point (s4, source_turn 1) is 1-based; it is found, then dropped as after the query.
    assert counts == Counter({"zero_based": 2, "one_based": 1, "whole_session": 1, "session_list": 1})
    assert {memory[i].key for i in q3.gold.evidence_ids} == {"s2:0", "s2:1"}


def test_evidence_after_the_query_is_dropped_and_counted(dataset):
    q2 = dataset.queries[1]
    assert q2.gold.evidence_ids == () and not q2.gold.temporal
    assert dataset.stats["evidence_after_query"] == {"later_day": 1}
    assert dataset_stats(dataset)["loader"]["no_evidence"] == 1


def test_one_based_source_turn(tmp_path):
    data = persona()
    data["dialogues"][0]["extracted_memory"][1]["source_turn"] = 3  # 1-based: s1 turn index 2
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    ds = load_dataset("realmem", str(path))
    assert Counter(ds.stats["evidence_turns"]) == Counter(
        {"one_based": 2, "zero_based": 1, "whole_session": 1, "session_list": 1}
    )


def test_bad_input_names_file_and_record(tmp_path):
    data = persona()
    del data["dialogues"][2]["dialogue_turns"][3]["content"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(
        DatasetError, match=r"broken\.json: dialogues\[2\] \(session Travel:S2_01\) turn 3: missing key 'content'"
    ):
        load_dataset("realmem", str(path))
    data = persona()
    data["dialogues"][1]["current_time"] = "someday"
    path.write_text(json.dumps(data))
    with pytest.raises(DatasetError, match=r"dialogues\[1\] \(session Fitness:S1_01\) current_time: unparseable"):
        load_dataset("realmem", str(path))
    data = persona()
    data["dialogues"][2]["dialogue_turns"] = data["dialogues"][2]["dialogue_turns"][:5]
    path.write_text(json.dumps(data))
    with pytest.raises(DatasetError, match="query Q-3.*followed by the assistant turn"):
        load_dataset("realmem", str(path))


def test_a_folder_loads_every_persona(tmp_path):
    for name in ("Ann_Example", "Bo_Example"):
        data = persona()
        data["_metadata"]["person_name"] = name
        (tmp_path / f"{name}_dialogues_256k.json").write_text(json.dumps(data))
    (tmp_path / "LICENSE").write_text("not json")
    ds = load_dataset("realmem", str(tmp_path))
    assert sorted(ds.memories) == ["Ann_Example", "Bo_Example"] and len(ds.queries) == 6


@pytest.mark.skipif(not REALMEM.is_dir(), reason="needs the RealMem dev copy at ../shared/data/realmem")
def test_realmem_dev_copy():
    ds = load_dataset("realmem", str(REALMEM))
    stats = dataset_stats(ds)
    assert (stats["conversations"], stats["queries"], stats["messages"]) == (7, 980, 9661)
    assert stats["loader"]["sessions_dated_before_the_previous"] == 46
    assert stats["loader"]["evidence_after_query"] == {"later_day": 5, "same_day_later": 1}
    for q in ds.queries:
        memory = ds.memories[q.memory_key]
        assert all(memory[i].timestamp < q.asked_at for i in q.gold.evidence_ids)
