"""LongMemEval loader (``longmemeval_s.json`` / ``_m`` / ``_oracle``: a list of questions).

Each question has its own haystack, so each question gets its own ``Memory`` (keyed by
``question_id``). Decisions:

- Granularity "day" by default (``granularity="minute"`` to keep minutes): every turn
  of a haystack session shares the session's ``haystack_dates`` time, and questions
  ask about days ("last Saturday", "two weeks ago").
- Message key ``"<session_id>:<turn index>"``, ``speaker`` and ``role`` = the turn's role.
- Evidence = turns flagged ``has_answer``. Fallback when a question flags none: every
  turn of its ``answer_session_ids`` (counted in ``stats["evidence_from_sessions"]``).
- Evidence timestamped after ``question_date`` (it happens, on the same day) is kept and
  counted in ``stats["evidence_after_question"]``.
- ``Query.category`` = ``question_type``; abstention questions (``question_id`` ending
  in ``_abs``) keep their type and are counted in ``stats["abstention"]``.
- ``Query.asked_at`` = ``question_date``; ``Query.user`` = "user".
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tqdm.auto import tqdm

from tider.data.errors import DatasetError, parse_timestamp
from tider.data.gold import gold_windows
from tider.data.locomo import read_json
from tider.types import Dataset, Gold, Memory, Message, Query

TIME_FORMATS = ("%Y/%m/%d (%a) %H:%M", "%Y/%m/%d %H:%M", "%Y-%m-%d %H:%M")
_REQUIRED = (
    "question_id",
    "question_type",
    "question",
    "answer",
    "question_date",
    "haystack_session_ids",
    "haystack_dates",
    "haystack_sessions",
)


def _question(item: dict, position: int, path: Path, granularity: str, stats: Counter, merge_gap, max_windows):
    if not isinstance(item, dict):
        raise DatasetError(path, f"question {position}", f"expected an object, got {type(item).__name__}")
    label = f"question {position} ({item.get('question_id', '?')})"
    for key in _REQUIRED:
        if key not in item:
            raise DatasetError(path, label, f"missing key {key!r}")
    qid = str(item["question_id"])
    session_ids, dates, sessions = item["haystack_session_ids"], item["haystack_dates"], item["haystack_sessions"]
    if not (isinstance(sessions, list) and isinstance(dates, list) and isinstance(session_ids, list)):
        raise DatasetError(path, label, "haystack_session_ids, haystack_dates and haystack_sessions must be lists")
    if not len(session_ids) == len(dates) == len(sessions):
        raise DatasetError(
            path,
            label,
            f"haystack lengths differ: {len(session_ids)} ids, {len(dates)} dates, {len(sessions)} sessions",
        )

    messages: list[Message] = []
    flagged: list[int] = []
    by_session: dict[str, list[int]] = {}
    for s_index, (sid, raw_date, turns) in enumerate(zip(session_ids, dates, sessions)):
        s_label = f"{label} session {s_index} ({sid})"
        when = parse_timestamp(raw_date, path=path, record=f"{s_label} date", formats=TIME_FORMATS)
        if not isinstance(turns, list):
            raise DatasetError(path, s_label, f"expected a list of turns, got {type(turns).__name__}")
        # A session id may repeat inside a haystack; a suffix keeps message keys unique.
        session = str(sid) if str(sid) not in by_session else f"{sid}#{s_index}"
        ids = by_session.setdefault(session, [])
        for t_index, turn in enumerate(turns):
            if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
                raise DatasetError(path, f"{s_label} turn {t_index}", "expected an object with 'role' and 'content'")
            ids.append(len(messages))
            if turn.get("has_answer"):
                flagged.append(len(messages))
            role = str(turn["role"])
            messages.append(
                Message(len(messages), f"{session}:{t_index}", str(turn["content"]), when, role, session, role=role)
            )
    memory = Memory(qid, messages, granularity)
    # Memory re-sorts by time (sessions need not be in order): map through the unique keys.
    final_id = {m.key: m.id for m in memory}
    evidence_keys = [messages[i].key for i in flagged]
    if not evidence_keys:
        answer_sessions = {str(s) for s in item.get("answer_session_ids") or []}
        evidence_keys = [
            messages[i].key for s in by_session if s.split("#")[0] in answer_sessions for i in by_session[s]
        ]
        stats["evidence_from_sessions"] += bool(evidence_keys)
    evidence_ids = sorted({final_id[k] for k in evidence_keys})
    asked_at = parse_timestamp(item["question_date"], path=path, record=f"{label} question_date", formats=TIME_FORMATS)
    stats["evidence_after_question"] += sum(memory[i].timestamp > asked_at for i in evidence_ids)
    stats["abstention"] += qid.endswith("_abs")
    stats["no_evidence"] += not evidence_ids
    temporal, windows = gold_windows(
        (memory[i].timestamp for i in evidence_ids), granularity, merge_gap=merge_gap, max_windows=max_windows
    )
    gold = Gold(answer=str(item["answer"]), evidence_ids=tuple(evidence_ids), windows=windows, temporal=temporal)
    query = Query(qid, qid, str(item["question"]), asked_at, "user", str(item["question_type"]), gold)
    return memory, query


def load_longmemeval(path: str, granularity: str = "day", merge_gap=None, max_windows: int | None = None) -> Dataset:
    """Load a LongMemEval JSON file; one memory per question."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, list):
        raise DatasetError(path, "file", f"expected a JSON list of questions, got {type(data).__name__}")
    stats: Counter = Counter()
    memories: dict[str, Memory] = {}
    queries: list[Query] = []
    for position, item in enumerate(tqdm(data, desc=f"loading {path.name}", unit=" questions", leave=False)):
        memory, query = _question(item, position, path, granularity, stats, merge_gap, max_windows)
        if memory.key in memories:
            raise DatasetError(path, f"question {position} ({memory.key})", "duplicate question_id")
        memories[memory.key] = memory
        queries.append(query)
    # has_answer flags point at turns directly, so nothing can be unresolved here.
    return Dataset(
        "longmemeval", granularity, memories, queries, {**dict(sorted(stats.items())), "unresolved_evidence": 0}
    )
