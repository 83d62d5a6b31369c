"""The generic JSONL format for your own data (and the on-disk synthetic benchmark).

A dataset is a directory with

- ``messages.jsonl``: one message per line (``MESSAGE_SCHEMA``),
- ``queries.jsonl``: one query per line (``QUERY_SCHEMA``),
- ``dataset.json`` (optional): ``{"name": ..., "granularity": "day" | "minute"}``.

Gold windows are never stored: they are derived from the evidence keys by
``tider.data.gold.gold_windows``, the same rule every loader uses. ``"temporal": false``
marks a query non-temporal. Evidence keys that match no message are dropped and
counted (``Gold.unresolved_evidence``), never fatal. Everything else that is wrong
(bad JSON, schema violation, unparseable time, unknown memory, duplicate key) raises
``DatasetError`` with the file and the line number. The schemas are also published as
``data/schema/*.schema.json`` (a test keeps the copies identical).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import jsonschema
from tqdm.auto import tqdm

from tider.data.errors import DatasetError, parse_timestamp
from tider.data.gold import gold_windows
from tider.types import Dataset, Gold, Memory, Message, Query

_TIME = {"type": "string", "minLength": 1, "description": "ISO 8601, e.g. 2023-05-08T13:56:00 (naive UTC)"}
_TEXT = {"type": "string", "minLength": 1}
_OPT_TEXT = {"type": ["string", "null"]}

MESSAGE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "tider message (one line of messages.jsonl)",
    "type": "object",
    "required": ["memory", "key", "text", "timestamp", "speaker"],
    "additionalProperties": False,
    "properties": {
        "memory": {**_TEXT, "description": "conversation / memory id the message belongs to"},
        "key": {**_TEXT, "description": "message id, unique within its memory; queries cite it as evidence"},
        "text": {"type": "string"},
        "timestamp": _TIME,
        "speaker": _TEXT,
        "session": {**_OPT_TEXT, "description": "session id; defaults to the message's date"},
        "channel": _OPT_TEXT,
        "topic": _OPT_TEXT,
        "phase": _OPT_TEXT,
        "stage": {"type": ["integer", "null"]},
        "role": _OPT_TEXT,
    },
}

QUERY_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "tider query (one line of queries.jsonl)",
    "type": "object",
    "required": ["key", "memory", "text", "asked_at"],
    "additionalProperties": False,
    "properties": {
        "key": {**_TEXT, "description": "query id, unique in the file (runs resume by it)"},
        "memory": {**_TEXT, "description": "the memory the question is asked of"},
        "text": _TEXT,
        "asked_at": _TIME,
        "user": _OPT_TEXT,
        "category": _OPT_TEXT,
        "answer": {"type": ["string", "number", "null"]},
        "evidence": {"type": "array", "items": {"type": "string"}, "description": "message keys"},
        "temporal": {"type": "boolean", "description": "false marks the query non-temporal"},
    },
}

_MESSAGE_VALIDATOR = jsonschema.Draft202012Validator(MESSAGE_SCHEMA)
_QUERY_VALIDATOR = jsonschema.Draft202012Validator(QUERY_SCHEMA)


def _records(path: Path, validator: jsonschema.Draft202012Validator) -> Iterator[tuple[str, dict]]:
    """``(record label, record)`` for each non-blank line, validated against the schema."""
    if not path.is_file():
        raise DatasetError(path, "file", "not found")
    with path.open(encoding="utf-8") as handle:
        lines = tqdm(
            handle, desc=f"reading {path.name}", unit=" lines", leave=False, mininterval=1.0, disable=None
        )  # TTY only
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            label = f"line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(path, label, f"invalid JSON ({exc.msg} at column {exc.colno})") from None
            error = jsonschema.exceptions.best_match(validator.iter_errors(record))
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "record"
                raise DatasetError(path, label, f"{where}: {error.message}")
            yield label, record


def _time(text: str, path: Path, label: str, field: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        value = parse_timestamp(text, path=path, record=f"{label} ({field})")
    if value.tzinfo is not None:
        value = value.replace(tzinfo=None) - value.utcoffset()
    return value


def _read_meta(root: Path) -> dict:
    meta_path = root / "dataset.json"
    if not meta_path.exists():
        return {}
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(meta_path, "file", f"invalid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(meta, dict):
        raise DatasetError(meta_path, "file", "expected a JSON object")
    return meta


def load_jsonl(
    path: str,
    granularity: str | None = None,
    name: str | None = None,
    merge_gap=None,
    max_windows: int | None = None,
) -> Dataset:
    """Load a generic JSONL dataset directory (see module docstring)."""
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(root, "directory", "not found (expected messages.jsonl + queries.jsonl)")
    meta = _read_meta(root)
    granularity = granularity or meta.get("granularity", "day")
    if granularity not in ("day", "minute"):
        raise DatasetError(root / "dataset.json", "granularity", f"must be 'day' or 'minute', got {granularity!r}")
    memories = _read_memories(root / "messages.jsonl", granularity)
    queries: list[Query] = []
    query_keys: set[str] = set()
    unresolved_total = 0
    queries_path = root / "queries.jsonl"
    for label, rec in _records(queries_path, _QUERY_VALIDATOR):
        if rec["key"] in query_keys:
            raise DatasetError(queries_path, label, f"duplicate query key {rec['key']!r}")
        query_keys.add(rec["key"])
        memory = memories.get(rec["memory"])
        if memory is None:
            raise DatasetError(queries_path, label, f"unknown memory {rec['memory']!r} (not in messages.jsonl)")
        query = _query(rec, memory, granularity, queries_path, label, merge_gap=merge_gap, max_windows=max_windows)
        unresolved_total += len(query.gold.unresolved_evidence)
        queries.append(query)
    stats = {"unresolved_evidence": unresolved_total}
    return Dataset(name or meta.get("name", "jsonl"), granularity, memories, queries, stats)


def _read_memories(messages_path: Path, granularity: str) -> dict[str, Memory]:
    """The memories in ``messages.jsonl``, each message's id its position in its memory (file order)."""
    by_memory: dict[str, list[Message]] = {}
    seen: set[tuple[str, str]] = set()
    for label, rec in _records(messages_path, _MESSAGE_VALIDATOR):
        memory_key, key = rec["memory"], rec["key"]
        if (memory_key, key) in seen:
            raise DatasetError(messages_path, label, f"duplicate message key {key!r} in memory {memory_key!r}")
        seen.add((memory_key, key))
        ts = _time(rec["timestamp"], messages_path, label, "timestamp")
        bucket = by_memory.setdefault(memory_key, [])
        bucket.append(
            Message(
                id=len(bucket),
                key=key,
                text=rec["text"],
                timestamp=ts,
                speaker=rec["speaker"],
                session=rec.get("session") or ts.date().isoformat(),
                channel=rec.get("channel"),
                topic=rec.get("topic"),
                phase=rec.get("phase"),
                stage=rec.get("stage"),
                role=rec.get("role"),
            )
        )
    return {key: Memory(key, msgs, granularity) for key, msgs in by_memory.items()}


def _query(rec: dict, memory: Memory, granularity: str, path: Path, label: str, merge_gap, max_windows) -> Query:
    """One validated ``queries.jsonl`` record as a ``Query`` of ``memory``: evidence keys
    resolved to message ids (those that match no message kept as unresolved), gold windows
    derived from them."""
    evidence_ids, unresolved = [], []
    for ref in rec.get("evidence", []):
        found = memory.id_of(ref)
        (unresolved.append(ref) if found is None else evidence_ids.append(found))
    evidence_ids = sorted(set(evidence_ids))
    temporal, windows = gold_windows(
        (memory[i].timestamp for i in evidence_ids),
        granularity,
        merge_gap=merge_gap,
        max_windows=max_windows,
        non_temporal=rec.get("temporal") is False,
    )
    answer = rec.get("answer")
    return Query(
        key=rec["key"],
        memory_key=rec["memory"],
        text=rec["text"],
        asked_at=_time(rec["asked_at"], path, label, "asked_at"),
        user=rec.get("user"),
        category=rec.get("category"),
        gold=Gold(
            answer=None if answer is None else str(answer),
            evidence_ids=tuple(evidence_ids),
            windows=windows,
            temporal=temporal,
            unresolved_evidence=tuple(unresolved),
        ),
    )


def _clean(record: dict) -> dict:
    return {k: v for k, v in record.items() if v is not None}


def write_jsonl(dataset: Dataset, out_dir: str) -> Path:
    """Write ``dataset`` in the generic JSONL format; byte-identical for equal datasets."""
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    meta = {"name": dataset.name, "granularity": dataset.granularity}
    (root / "dataset.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    # Write to a temporary name and rename, so an interrupted write never leaves a
    # half-file that a later load would take for a complete dataset.
    tmp = root / "messages.jsonl.tmp"
    with tmp.open("w", encoding="utf-8") as out:
        for memory in dataset.memories.values():
            for m in memory:
                rec = {
                    "memory": memory.key,
                    "key": m.key,
                    "text": m.text,
                    "timestamp": m.timestamp.isoformat(timespec="seconds"),
                    "speaker": m.speaker,
                    "session": m.session,
                    "channel": m.channel,
                    "topic": m.topic,
                    "phase": m.phase,
                    "stage": m.stage,
                    "role": m.role,
                }
                out.write(json.dumps(_clean(rec), ensure_ascii=False) + "\n")
    tmp.replace(root / "messages.jsonl")
    tmp = root / "queries.jsonl.tmp"
    with tmp.open("w", encoding="utf-8") as out:
        for q in dataset.queries:
            memory = dataset.memories[q.memory_key]
            rec = {
                "key": q.key,
                "memory": q.memory_key,
                "text": q.text,
                "asked_at": q.asked_at.isoformat(timespec="seconds"),
                "user": q.user,
                "category": q.category,
                "answer": q.gold.answer,
                "evidence": [memory[i].key for i in q.gold.evidence_ids] + list(q.gold.unresolved_evidence),
                "temporal": q.gold.temporal,
            }
            out.write(json.dumps(_clean(rec), ensure_ascii=False) + "\n")
    tmp.replace(root / "queries.jsonl")
    return root
