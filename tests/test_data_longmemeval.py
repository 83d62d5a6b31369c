import json
from datetime import datetime

import pytest

from tider.data import DatasetError, load_dataset
from tider.data.stats import dataset_stats


def question(qid="q1", **overrides):
    """A LongMemEval record in the documented format."""
    record = {
        "question_id": qid,
        "question_type": "temporal-reasoning",
        "question": "Which park did I visit two days ago?",
        "answer": "Riverside Park",
        "question_date": "2023/05/30 (Tue) 10:40",
        "haystack_session_ids": ["s_b", "s_a", "s_c"],
        # Sessions are not in time order in the file; s_c is later the same day as the question.
        "haystack_dates": ["2023/05/28 (Sun) 09:00", "2023/05/01 (Mon) 17:30", "2023/05/30 (Tue) 23:40"],
        "haystack_sessions": [
            [
                {"role": "user", "content": "I walked in Riverside Park.", "has_answer": True},
                {"role": "assistant", "content": "Sounds lovely."},
            ],
            [{"role": "user", "content": "I like parks."}, {"role": "assistant", "content": "Me too."}],
            [{"role": "user", "content": "Riverside Park again tonight!", "has_answer": True}],
        ],
        "answer_session_ids": ["s_b", "s_c"],
    }
    record.update(overrides)
    return record


def write(tmp_path, records):
    path = tmp_path / "longmemeval_s.json"
    path.write_text(json.dumps(records))
    return path


def test_one_memory_per_question_evidence_from_has_answer(tmp_path):
    data = load_dataset("longmemeval", str(write(tmp_path, [question("q1"), question("q2_abs")])))
    assert sorted(data.memories) == ["q1", "q2_abs"]
    memory, query = data.memories["q1"], data.queries[0]
    assert [m.key for m in memory] == ["s_a:0", "s_a:1", "s_b:0", "s_b:1", "s_c:0"]  # time order
    assert memory[0].role == "user" and memory[0].speaker == "user" and memory[0].session == "s_a"
    assert query.asked_at == datetime(2023, 5, 30, 10, 40) and query.category == "temporal-reasoning"
    assert query.gold.evidence_ids == (memory.id_of("s_b:0"), memory.id_of("s_c:0"))
    assert [w.to_json("day") for w in query.gold.windows] == [
        {"start": "2023-05-28", "end": "2023-05-28"},
        {"start": "2023-05-30", "end": "2023-05-30"},
    ]
    # The same-day evidence after the question is kept and counted (once per question).
    assert data.stats["evidence_after_question"] == 2
    assert data.stats["abstention"] == 1
    assert dataset_stats(data)["by_window_bucket"] == {"0": 0, "1": 0, "2": 2, ">=3": 0}


def test_answer_sessions_are_the_fallback_evidence(tmp_path):
    record = question()
    for session in record["haystack_sessions"]:
        for turn in session:
            turn.pop("has_answer", None)
    data = load_dataset("longmemeval", str(write(tmp_path, [record])))
    memory = data.memories["q1"]
    assert data.queries[0].gold.evidence_ids == tuple(memory.id_of(k) for k in ("s_b:0", "s_b:1", "s_c:0"))
    assert data.stats["evidence_from_sessions"] == 1


def test_minute_granularity_option(tmp_path):
    data = load_dataset("longmemeval", str(write(tmp_path, [question()])), granularity="minute")
    assert data.granularity == "minute"
    assert data.queries[0].gold.windows[0].to_json("minute") == {"start": "2023-05-28T09:00", "end": "2023-05-28T09:00"}


@pytest.mark.parametrize(
    "overrides, record, problem",
    [
        ({"question_date": "Tuesday-ish"}, "question 0 (q1) question_date", "unparseable timestamp"),
        (
            {"haystack_dates": ["2023/05/28 (Sun) 09:00", "never", "2023/05/30 (Tue) 23:40"]},
            "question 0 (q1) session 1 (s_a) date",
            "unparseable timestamp",
        ),
        ({"haystack_dates": ["2023/05/28 (Sun) 09:00"]}, "question 0 (q1)", "haystack lengths differ"),
        ({"haystack_sessions": [[{"content": "x"}], [], []]}, "question 0 (q1) session 0 (s_b) turn 0", "'role'"),
    ],
)
def test_malformed_records_name_file_and_record(tmp_path, overrides, record, problem):
    path = write(tmp_path, [question(**overrides)])
    with pytest.raises(DatasetError) as info:
        load_dataset("longmemeval", str(path))
    assert str(path) in str(info.value) and record in str(info.value) and problem in str(info.value)


def test_missing_key_and_truncated_file(tmp_path):
    record = question()
    del record["answer"]
    with pytest.raises(DatasetError, match=r"question 0 \(q1\): missing key 'answer'"):
        load_dataset("longmemeval", str(write(tmp_path, [record])))
    path = tmp_path / "cut.json"
    path.write_text(json.dumps([question()])[:-40])
    with pytest.raises(DatasetError, match=r"cut\.json: line 1 column \d+: invalid JSON"):
        load_dataset("longmemeval", str(path))
