"""RealMem loader (``<Persona>_dialogues_256k.json``: one persona's dated sessions).

A persona file is ``{"_metadata": {"person_name": ...}, "dialogues": [session, ...]}``;
a session has ``session_uuid``, ``current_time`` (``"2025-12-19 (Friday)"``, day
precision), ``dialogue_turns`` and ``extracted_memory``. ``path`` is one persona file or
a folder of them (every ``*.json`` with a ``dialogues`` list); each persona is one memory.

Decisions (each has a test in ``tests/test_data_realmem.py``):

- **Time order.** ``current_time`` has no clock time, one persona has 35 sessions on one
  day, and some sessions are out of date order in the file. Messages are ordered by
  (day, the session's position in the file, the turn's index), and the day's n-th message
  in that order is stamped n seconds after midnight, so every message has its own instant
  and a window of whole days still holds exactly that day's messages. Within a day the
  file order is the order the data uses: every same-day session a query draws on comes
  before it in the file.
- **Queries.** A user turn with ``is_query: true``. ``asked_at`` is one microsecond before
  the query turn's instant: the memory it searches ends with the turn before it, so the
  question itself, its answer and everything after are never visible (``past_only``).
  ``Query.user`` = "User", ``category`` = ``category_name``, ``answer`` = the assistant
  turn that replies to it.
- **Evidence is turn-level.** The assistant turn right after a query lists the memory
  points it used (``memory_used``: session uuid + content); each is an entry of that
  session's ``extracted_memory`` (matched by content), whose ``source_turn`` names the
  message: checked against ``source_content_snapshot``, it is 1-based for most points and
  0-based for some (``stats["evidence_turns"]``: ``one_based`` / ``zero_based``); a point
  whose turn matches neither, or that matches no extracted entry, falls back to the whole
  session (``whole_session``). A reply that lists only ``memory_session_uuids`` takes
  those sessions whole (``session_list``).
- **Nothing after the query is evidence.** Evidence at or after the query's position
  (a session dated after the query, a later turn of the same day) is dropped and counted
  by kind in ``stats["evidence_after_query"]`` (``later_day``, ``same_day_later``).
- Bad input (a missing key, a bad date, a query that ends its session) raises
  ``DatasetError`` naming the file and the record.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

from tider.data.errors import DatasetError, parse_timestamp
from tider.data.gold import gold_windows
from tider.data.locomo import read_json
from tider.types import Dataset, Gold, Memory, Message, Query

QUERY_USER = "User"
ASKED_BEFORE = timedelta(microseconds=1)


@dataclass
class _Session:
    position: int  # in the file
    uuid: str
    label: str
    day: datetime
    turns: list
    memory: list


def persona_files(path: Path) -> list[Path]:
    """``path`` itself, or the persona files in the folder ``path`` (sorted by name)."""
    if path.is_dir():
        files = sorted(p for p in path.glob("*.json") if _is_persona_file(p))
        if not files:
            raise DatasetError(path, "folder", "no RealMem persona files (*.json with a 'dialogues' list) here")
        return files
    return [path]


def _is_persona_file(path: Path) -> bool:
    with path.open(encoding="utf-8") as handle:
        head = handle.read(4096)
    return '"dialogues"' in head


def _require(record, key: str, path: Path, label: str):
    if not isinstance(record, dict):
        raise DatasetError(path, label, f"expected an object, got {type(record).__name__}")
    if key not in record:
        raise DatasetError(path, label, f"missing key {key!r}")
    return record[key]


def _sessions(data, path: Path) -> list[_Session]:
    dialogues = _require(data, "dialogues", path, "file")
    if not isinstance(dialogues, list):
        raise DatasetError(path, "dialogues", f"expected a list of sessions, got {type(dialogues).__name__}")
    out = []
    for position, raw in enumerate(dialogues):
        label = f"dialogues[{position}]"
        uuid = str(_require(raw, "session_uuid", path, label))
        label = f"{label} (session {raw.get('session_identifier', uuid)})"
        when = str(_require(raw, "current_time", path, label)).split("(")[0].strip()
        day = parse_timestamp(when, path=path, record=f"{label} current_time", formats=("%Y-%m-%d",))
        turns = _require(raw, "dialogue_turns", path, label)
        memory = raw.get("extracted_memory") or []
        if not isinstance(turns, list) or not isinstance(memory, list):
            raise DatasetError(path, label, "'dialogue_turns' and 'extracted_memory' must be lists")
        out.append(
            _Session(position, uuid, label, day.replace(hour=0, minute=0, second=0, microsecond=0), turns, memory)
        )
    return out


def _messages(sessions: list[_Session], path: Path) -> tuple[list[Message], dict[tuple[str, int], int]]:
    """Messages in time order, and ``(session uuid, turn index) -> message id``."""
    messages: list[Message] = []
    where: dict[tuple[str, int], int] = {}
    seen: set[str] = set()
    per_day: Counter = Counter()
    for s in sessions:
        if s.uuid in seen:
            raise DatasetError(path, s.label, f"duplicate session_uuid {s.uuid!r}")
        seen.add(s.uuid)
        for index, turn in enumerate(s.turns):
            label = f"{s.label} turn {index}"
            speaker = str(_require(turn, "speaker", path, label))
            content = _require(turn, "content", path, label)
            per_day[s.day] += 1
            stamp = s.day + timedelta(seconds=per_day[s.day])
            where[(s.uuid, index)] = len(messages)
            messages.append(
                Message(len(messages), f"{s.uuid}:{index}", str(content), stamp, speaker, s.uuid, role=speaker.lower())
            )
    return messages, where


def _point_turns(point: dict, session: _Session) -> tuple[list[int], str]:
    """Turn indices of one ``memory_used`` point in its session, and how they were found."""
    entry = next((m for m in session.memory if isinstance(m, dict) and m.get("content") == point.get("content")), None)
    if entry is not None:
        turn, snapshot = entry.get("source_turn"), str(entry.get("source_content_snapshot", "")).strip()
        for index, kind in ((turn - 1, "one_based"), (turn, "zero_based")) if isinstance(turn, int) else ():
            if 0 <= index < len(session.turns) and str(session.turns[index].get("content", "")).strip() == snapshot:
                return [index], kind
    return list(range(len(session.turns))), "whole_session"


def _evidence(reply: dict, by_uuid: dict, where: dict, stats: Counter) -> list[int]:
    """Message ids of the evidence a reply lists (before any cut)."""
    turns_found = stats.setdefault("evidence_turns", Counter())
    points = reply.get("memory_used") or []
    ids: list[int] = []
    if not points:
        for uuid in reply.get("memory_session_uuids") or []:
            if uuid in by_uuid:
                turns_found["session_list"] += 1
                ids += [where[(uuid, i)] for i in range(len(by_uuid[uuid].turns))]
            else:
                stats["unknown_session"] += 1
        return ids
    for point in points:
        session = by_uuid.get(point.get("session_uuid")) if isinstance(point, dict) else None
        if session is None:
            stats["unknown_session"] += 1
            continue
        indices, kind = _point_turns(point, session)
        turns_found[kind] += 1
        ids += [where[(session.uuid, i)] for i in indices]
    return ids


def _queries(
    persona: str,
    memory: Memory,
    sessions: list[_Session],
    where: dict,
    path: Path,
    granularity: str,
    stats: Counter,
    merge_gap,
    max_windows,
) -> list[Query]:
    by_uuid = {s.uuid: s for s in sessions}
    dropped = stats.setdefault("evidence_after_query", Counter())
    queries = []
    for s in sessions:
        for index, turn in enumerate(s.turns):
            if not turn.get("is_query"):
                continue
            label = f"{s.label} turn {index} (query {turn.get('query_id')})"
            if index + 1 >= len(s.turns) or not isinstance(s.turns[index + 1], dict):
                raise DatasetError(path, label, "a query turn must be followed by the assistant turn that answers it")
            reply = s.turns[index + 1]
            position = where[(s.uuid, index)]
            asked_at = memory[position].timestamp - ASKED_BEFORE
            evidence = sorted(set(_evidence(reply, by_uuid, where, stats)))
            kept = [i for i in evidence if i < position]
            for i in evidence[len(kept) :]:
                dropped["same_day_later" if memory[i].timestamp.date() == asked_at.date() else "later_day"] += 1
            temporal, windows = gold_windows(
                (memory[i].timestamp for i in kept), granularity, merge_gap=merge_gap, max_windows=max_windows
            )
            gold = Gold(
                answer=str(reply.get("content", "")), evidence_ids=tuple(kept), windows=windows, temporal=temporal
            )
            key = f"{persona}:{turn.get('query_id') or f'{s.uuid}:{index}'}"
            queries.append(
                Query(
                    key,
                    persona,
                    str(_require(turn, "content", path, label)),
                    asked_at,
                    QUERY_USER,
                    str(turn.get("category_name") or "query"),
                    gold,
                )
            )
            stats["no_evidence"] += not kept
    return queries


def _persona(path: Path, granularity: str, stats: Counter, merge_gap, max_windows) -> tuple[Memory, list[Query]]:
    data = read_json(path)
    meta = data.get("_metadata") if isinstance(data, dict) else None
    persona = str((meta or {}).get("person_name") or path.stem.split("_dialogues")[0])
    in_file = _sessions(data, path)
    sessions = sorted(in_file, key=lambda s: (s.day, s.position))
    messages, where = _messages(sessions, path)
    if not messages:
        raise DatasetError(path, "dialogues", "no turns")
    # Stamps are strictly increasing in this order, so the Memory keeps it (id == position).
    memory = Memory(persona, messages, granularity)
    stats["sessions"] += len(sessions)
    stats["sessions_dated_before_the_previous"] += sum(b.day < a.day for a, b in pairwise(in_file))
    return memory, _queries(persona, memory, sessions, where, path, granularity, stats, merge_gap, max_windows)


def load_realmem(path: str, granularity: str = "day", merge_gap=None, max_windows: int | None = None) -> Dataset:
    """Load one RealMem persona file, or every persona file in a folder."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(path, "file", "not found")
    stats: Counter = Counter()
    memories: dict[str, Memory] = {}
    queries: list[Query] = []
    for file in persona_files(path):
        memory, persona_queries = _persona(file, granularity, stats, merge_gap, max_windows)
        if memory.key in memories:
            raise DatasetError(file, "_metadata", f"persona {memory.key!r} appears in two files")
        memories[memory.key] = memory
        queries += persona_queries
    stats = {k: dict(sorted(v.items())) if isinstance(v, Counter) else v for k, v in sorted(stats.items())}
    return Dataset("realmem", granularity, memories, queries, {**stats, "unresolved_evidence": 0})
