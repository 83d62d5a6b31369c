"""What ``TemporalMemory.add`` accepts, turned into ``Message``s, and the one error it raises.

A message is a ``Message`` or a dict with ``text`` and ``timestamp`` (required),
``speaker``, ``session``, ``key`` and the optional metadata fields (``channel``, ``topic``,
``phase``, ``stage``, ``role``). Timestamps are ISO 8601 strings or ``datetime``s:
timezone-aware ones are converted to UTC, naive ones are taken as UTC (docs/design.md, decision 1).
A missing ``key`` is generated from the content (a hash of text, time, speaker and
session), so re-adding the same keyless message is a no-op like re-adding a keyed one.
Anything else that is wrong raises ``MemoryInputError`` naming the record and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import fields
from datetime import datetime, timezone
from typing import Any

from dateutil.parser import isoparse

from tider.types import Message

OPTIONAL_TEXT = ("channel", "topic", "phase", "role")
KNOWN_FIELDS = {f.name for f in fields(Message)} - {"id"}


class MessageNotFound(KeyError):
    """A management call named a key the memory does not hold."""

    def __init__(self, memory: str, key: str):
        self.memory, self.key = memory, key
        super().__init__(f"memory {memory!r} holds no message {key!r}")


class VersionConflict(Exception):
    """An update named the version it read, and the message has changed since (HTTP 409)."""

    def __init__(self, memory: str, key: str, current: str):
        self.memory, self.key, self.current = memory, key, current
        super().__init__(f"memory {memory!r}: message {key!r} changed (now version {current!r}); read it again")


class MemoryInputError(ValueError):
    """Bad input to a memory; ``field`` names where (``messages[3].timestamp``)."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


def to_utc(value: Any, field: str) -> datetime:
    """ISO string or datetime -> naive UTC datetime."""
    if isinstance(value, datetime):
        ts = value
    elif isinstance(value, str) and value.strip():
        try:
            ts = isoparse(value.strip())
        except (ValueError, OverflowError) as err:
            raise MemoryInputError(field, f"not an ISO 8601 time: {value!r} ({err})") from None
    else:
        raise MemoryInputError(field, f"expected an ISO 8601 string or a datetime, got {type(value).__name__}")
    if ts.tzinfo is not None:
        ts = ts.astimezone(timezone.utc).replace(tzinfo=None)
    return ts


# C0 controls other than tab, newline and carriage return: PostgreSQL cannot store NUL, and
# none of them is text a person wrote (real conversations carry a few: RealMem has U+0002).
# Every backend stores the text without them, so both store and return the same text.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def checked_text(value: str, field: str) -> str:
    """``value`` as every backend stores and searches it: control characters other than tab
    and newlines removed; a lone surrogate (a JSON ``\\ud800`` escape: not valid Unicode,
    which no backend can encode) is a ``MemoryInputError``, the service's 422."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise MemoryInputError(field, f"not valid Unicode at position {err.start} (a lone surrogate)") from None
    return _CONTROL.sub("", value)


def _text(record: Mapping, name: str, where: str, required: bool = False, default: str | None = None) -> str | None:
    value = record.get(name, default)
    if value is None:
        if required:
            raise MemoryInputError(f"{where}.{name}", "required")
        return None
    if not isinstance(value, str):
        raise MemoryInputError(f"{where}.{name}", f"expected a string, got {type(value).__name__}")
    return checked_text(value, f"{where}.{name}")


MAX_METADATA = 32  # fields a message's metadata may hold


def checked_metadata(value: Any, field: str) -> tuple:
    """A ``metadata`` mapping (or a message's pairs) as a message holds it: sorted (name,
    value) pairs, names of 1-64 characters, values strings, numbers or booleans."""
    if value is None or value == ():
        return ()
    pairs = value.items() if isinstance(value, Mapping) else value
    if not isinstance(value, Mapping | tuple):
        raise MemoryInputError(field, f"expected an object, got {type(value).__name__}")
    out = {}
    for name, item in pairs:
        if not isinstance(name, str) or not 1 <= len(name) <= 64:
            raise MemoryInputError(field, f"a field name must be a string of 1-64 characters, got {name!r}")
        if isinstance(item, str):
            item = checked_text(item, f"{field}.{name}")
        elif not isinstance(item, bool | int | float) or (isinstance(item, float) and math.isnan(item)):
            raise MemoryInputError(f"{field}.{name}", f"expected a string, number or boolean, got {item!r}")
        out[checked_text(name, field)] = item
    if len(out) > MAX_METADATA:
        raise MemoryInputError(field, f"at most {MAX_METADATA} fields, got {len(out)}")
    return tuple(sorted(out.items()))


def content_key(text: str, timestamp: datetime, speaker: str, session: str) -> str:
    blob = json.dumps([text, timestamp.isoformat(), speaker, session], ensure_ascii=False)
    return "m-" + hashlib.sha1(blob.encode("utf-8")).hexdigest()[:16]


def to_message(record: Message | Mapping, where: str) -> Message:
    """One input record -> ``Message`` (``id`` is assigned by the memory)."""
    if isinstance(record, Message):
        record = {f: getattr(record, f) for f in KNOWN_FIELDS}
    if not isinstance(record, Mapping):
        raise MemoryInputError(where, f"expected an object, got {type(record).__name__}")
    unknown = set(record) - KNOWN_FIELDS
    if unknown:
        raise MemoryInputError(f"{where}.{min(unknown)}", f"unknown field; known: {sorted(KNOWN_FIELDS)}")
    text = _text(record, "text", where, required=True)
    if "timestamp" not in record or record["timestamp"] is None:
        raise MemoryInputError(f"{where}.timestamp", "required")
    timestamp = to_utc(record["timestamp"], f"{where}.timestamp")
    speaker = _text(record, "speaker", where, default="") or ""
    session = _text(record, "session", where) or timestamp.date().isoformat()
    stage = record.get("stage")
    if stage is not None and (isinstance(stage, bool) or not isinstance(stage, int)):
        raise MemoryInputError(f"{where}.stage", f"expected an integer, got {type(stage).__name__}")
    key = _text(record, "key", where)
    if key is not None and not key:
        raise MemoryInputError(f"{where}.key", "empty")
    extra = {name: _text(record, name, where) for name in OPTIONAL_TEXT}
    extra["metadata"] = checked_metadata(record.get("metadata"), f"{where}.metadata")
    return Message(
        id=-1,
        key=key or content_key(text, timestamp, speaker, session),
        text=text,
        timestamp=timestamp,
        speaker=speaker,
        session=session,
        stage=stage,
        **extra,
    )


def to_messages(records: Iterable[Message | Mapping]) -> list[Message]:
    if isinstance(records, (str, bytes, Mapping)):
        raise MemoryInputError("messages", "expected a list of messages")
    return [to_message(r, f"messages[{i}]") for i, r in enumerate(records)]


def message_to_json(m: Message) -> dict:
    """The stored form of a message (the log line), without the time-order ``id``."""
    out = {
        "key": m.key,
        "text": m.text,
        "timestamp": m.timestamp.isoformat(),
        "speaker": m.speaker,
        "session": m.session,
    }
    out.update({f: getattr(m, f) for f in (*OPTIONAL_TEXT, "stage") if getattr(m, f) is not None})
    if m.metadata:
        out["metadata"] = dict(m.metadata)
    return out


def version_of(m: Message) -> str:
    """A message's version: a hash of what is stored of it (its ETag over HTTP). Any change
    of text, time or field changes it; its position in time order does not. Content-derived,
    so both backends give one message the same version and no schema holds a counter."""
    canonical = json.dumps(message_to_json(m), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def message_from_json(data: dict, row: int) -> Message:
    return Message(
        id=row,
        key=data["key"],
        text=data["text"],
        timestamp=datetime.fromisoformat(data["timestamp"]),
        speaker=data["speaker"],
        session=data["session"],
        stage=data.get("stage"),
        metadata=tuple(sorted(data.get("metadata", {}).items())),
        **{f: data.get(f) for f in OPTIONAL_TEXT},
    )
