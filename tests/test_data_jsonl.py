import json
from datetime import datetime
from pathlib import Path

import pytest

from tider.data import DatasetError, load_dataset
from tider.data.jsonl import MESSAGE_SCHEMA, QUERY_SCHEMA, write_jsonl

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "data" / "schema"

MESSAGES = [
    {
        "memory": "team",
        "key": "m1",
        "text": "the offsite is in oslo",
        "timestamp": "2023-05-08T13:56:00",
        "speaker": "ann",
        "channel": "#events",
        "topic": "offsite",
        "phase": "report",
        "stage": 0,
    },
    {"memory": "team", "key": "m0", "text": "hello", "timestamp": "2023-05-08T09:00:00", "speaker": "bo"},
    {
        "memory": "team",
        "key": "m2",
        "text": "my pet is a cat",
        "timestamp": "2023-06-01T10:00:00+02:00",
        "speaker": "bo",
        "session": "june",
    },
    {
        "memory": "other",
        "key": "m1",
        "text": "same key, other memory",
        "timestamp": "2023-01-01T00:00:00",
        "speaker": "cy",
    },
]
QUERIES = [
    {
        "key": "q1",
        "memory": "team",
        "text": "Where was the offsite on 2023-05-08?",
        "asked_at": "2023-07-01T09:00:00",
        "user": "bo",
        "category": "absolute",
        "answer": "oslo",
        "evidence": ["m1", "m9"],
    },
    {
        "key": "q2",
        "memory": "team",
        "text": "What is bo's pet?",
        "asked_at": "2023-07-01T09:00:00",
        "answer": 7,
        "evidence": ["m2"],
        "temporal": False,
    },
]


def write_dir(root, messages=MESSAGES, queries=QUERIES, meta=None):
    root.mkdir(exist_ok=True)
    (root / "messages.jsonl").write_text("".join(json.dumps(r) + "\n" for r in messages))
    (root / "queries.jsonl").write_text("\n".join(q if isinstance(q, str) else json.dumps(q) for q in queries) + "\n")
    if meta is not None:
        (root / "dataset.json").write_text(json.dumps(meta))
    return root


def test_load_generic_jsonl(tmp_path):
    data = load_dataset("jsonl", str(write_dir(tmp_path / "d")))
    team = data.memories["team"]
    assert [m.key for m in team] == ["m0", "m1", "m2"]
    assert team[1].channel == "#events" and team[1].stage == 0 and team[0].session == "2023-05-08"
    assert team[2].timestamp == datetime(2023, 6, 1, 8, 0)  # offsets converted to naive UTC
    q1, q2 = data.queries
    assert q1.gold.evidence_ids == (1,) and q1.gold.unresolved_evidence == ("m9",) and q1.gold.temporal
    assert q2.gold.temporal is False and q2.gold.windows == () and q2.gold.evidence_ids == (2,)
    assert q2.gold.answer == "7" and q2.user is None
    assert data.stats["unresolved_evidence"] == 1 and data.granularity == "day" and data.name == "jsonl"


def test_roundtrip_is_lossless_and_byte_identical(tmp_path):
    data = load_dataset("jsonl", str(write_dir(tmp_path / "d", meta={"name": "mine", "granularity": "minute"})))
    assert data.granularity == "minute" and data.name == "mine"
    write_jsonl(data, tmp_path / "out1")
    again = load_dataset("jsonl", str(tmp_path / "out1"))
    write_jsonl(again, tmp_path / "out2")
    for name in ("messages.jsonl", "queries.jsonl", "dataset.json"):
        assert (tmp_path / "out1" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes()
    assert [(q.key, q.gold) for q in again.queries] == [(q.key, q.gold) for q in data.queries]
    assert {k: list(m) for k, m in again.memories.items()} == {k: list(m) for k, m in data.memories.items()}


@pytest.mark.parametrize(
    "queries, record, problem",
    [
        ([QUERIES[0], '{"key": "q3", "memory": "team"'], "queries.jsonl: line 2", "invalid JSON"),
        (
            [{k: v for k, v in QUERIES[0].items() if k != "asked_at"}],
            "queries.jsonl: line 1",
            "'asked_at' is a required property",
        ),
        ([{**QUERIES[0], "asked_at": "the day after"}], "queries.jsonl: line 1 (asked_at)", "unparseable timestamp"),
        ([{**QUERIES[0], "evidence": "m1"}], "queries.jsonl: line 1", "evidence: 'm1' is not of type 'array'"),
        ([{**QUERIES[0], "memory": "nobody"}], "queries.jsonl: line 1", "unknown memory 'nobody'"),
        ([QUERIES[0], QUERIES[0]], "queries.jsonl: line 2", "duplicate query key 'q1'"),
        ([{**QUERIES[0], "colour": "red"}], "queries.jsonl: line 1", "Additional properties"),
    ],
)
def test_bad_queries_name_file_and_line(tmp_path, queries, record, problem):
    root = write_dir(tmp_path / "d", queries=queries)
    with pytest.raises(DatasetError) as info:
        load_dataset("jsonl", str(root))
    assert record in str(info.value) and problem in str(info.value)


def test_bad_messages_name_file_and_line(tmp_path):
    bad = [MESSAGES[0], {**MESSAGES[1], "timestamp": "yesterday-ish"}]
    with pytest.raises(DatasetError, match=r"messages\.jsonl: line 2 \(timestamp\): unparseable timestamp"):
        load_dataset("jsonl", str(write_dir(tmp_path / "a", messages=bad)))
    with pytest.raises(DatasetError, match=r"messages\.jsonl: line 2: duplicate message key 'm1'"):
        load_dataset("jsonl", str(write_dir(tmp_path / "b", messages=[MESSAGES[0], MESSAGES[0]])))
    with pytest.raises(DatasetError, match=r"messages\.jsonl: line 1: speaker"):
        load_dataset("jsonl", str(write_dir(tmp_path / "c", messages=[{**MESSAGES[0], "speaker": 3}])))
    with pytest.raises(DatasetError, match="granularity"):
        load_dataset("jsonl", str(write_dir(tmp_path / "e", meta={"granularity": "week"})))
    with pytest.raises(DatasetError, match="not found"):
        load_dataset("jsonl", str(tmp_path / "nowhere"))


def test_published_schema_files_match_the_loader():
    assert json.loads((SCHEMA_DIR / "message.schema.json").read_text()) == MESSAGE_SCHEMA
    assert json.loads((SCHEMA_DIR / "query.schema.json").read_text()) == QUERY_SCHEMA
