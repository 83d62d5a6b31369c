"""LoCoMo loader (``locomo10.json`` format: a list of conversations with ``qa``).

Decisions and quirks handled (each has a test in ``tests/test_data_locomo.py``):

- Granularity "day": all turns of a session share the session's timestamp, so minutes
  carry no information about where evidence lies; messages keep the full timestamp.
- Session times like ``"1:56 pm on 8 May, 2023"``; a turn's own ``date_time``
  (e.g. ``"29.12.2023, 22:42:04"``, day first) overrides its session's.
- ``session_N_date_time`` keys with no ``session_N`` turns are ignored (counted in
  ``stats["sessions_without_turns"]``).
- Evidence is resolved by looking up the ``dia_id`` in the conversation, never by
  taking the D-number as a session index. Entries are split on ``;``, ``,`` and
  whitespace (``"D8:6; D9:17"``). Irregular refs seen in LoCoMo-format releases are
  resolved when they are unambiguous, each kind counted in ``stats["evidence_quirks"]``:
  ``"D:11:26"`` -> ``D11:26`` (``repaired_colon``, also ``stats["repaired_evidence"]``),
  ``"D5:3."`` -> ``D5:3`` (``trailing_punctuation``), ``"D13:45:D20:19"`` -> both refs
  (``joined_refs``), ``"D12:3-D12:5"`` or ``"D12:3-5"`` -> every turn 3 to 5 of D12
  (``range``). What stays ambiguous or matches no turn is dropped, kept in
  ``Gold.unresolved_evidence``, counted in ``stats["unresolved_evidence"]`` and by kind in
  ``stats["unresolved_by_kind"]``: ``bare_number`` (``"14"``: a turn of which dialogue?),
  ``cross_dialogue_range`` (``"D3:7-D4:2"``), ``no_such_turn`` (a well-formed ref the
  conversation lacks, or a range end past it) and ``malformed`` (``"D"``). Never fatal.
- Image turns: the BLIP caption is appended as ``[image: caption]``.
- Answers: integers become strings. Category 5 (adversarial) has no true answer in the
  data, only the trap ``adversarial_answer``: ``Gold.answer`` is the LoCoMo evaluation's
  expected reply "Not mentioned in the conversation" (or ``answer`` when present) and
  the trap goes to ``Gold.adversarial_answer``.
- ``Query.asked_at``: LoCoMo has no question time; we use the time of the last message
  (the end of the last session). ``Query.user``: None (LoCoMo names no asker).
- Gold windows: ``tider.data.gold`` rule; ``non_temporal_categories`` (default none)
  lists categories whose queries are marked non-temporal.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from tider.data.errors import DatasetError, parse_timestamp
from tider.data.gold import gold_windows
from tider.types import Dataset, Gold, Memory, Message, Query

LOCOMO_ADVERSARIAL_ANSWER = "Not mentioned in the conversation"
SESSION_TIME_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M %p on %B %d, %Y")
TURN_TIME_FORMATS = ("%d.%m.%Y, %H:%M:%S", "%d.%m.%Y, %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S")
_SESSION_KEY = re.compile(r"session_(\d+)")
_EVIDENCE_REF = re.compile(r"D:?(\d+):(\d+)", re.IGNORECASE)
_JOINED_REFS = re.compile(r"D(\d+):(\d+):D(\d+):(\d+)", re.IGNORECASE)
_RANGE = re.compile(r"D(\d+):(\d+)-(?:D(\d+):)?(\d+)", re.IGNORECASE)


def read_json(path: Path):
    """Parse a JSON file; missing files and truncated/invalid JSON name the file and position."""
    if not path.is_file():
        raise DatasetError(path, "file", "not found")
    try:
        with path.open(encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as exc:
        raise DatasetError(path, f"line {exc.lineno} column {exc.colno}", f"invalid JSON ({exc.msg})") from None


def _require(record: dict, key: str, path: Path, label: str):
    if not isinstance(record, dict):
        raise DatasetError(path, label, f"expected an object, got {type(record).__name__}")
    if key not in record:
        raise DatasetError(path, label, f"missing key {key!r}")
    return record[key]


def _turn_text(turn: dict) -> str:
    text = str(turn.get("text") or "").strip()
    caption = turn.get("blip_caption")
    if caption:
        text = f"{text} [image: {caption}]".strip()
    return text


def _messages(conversation: dict, sample: str, path: Path, stats: Counter) -> list[Message]:
    sessions = sorted((int(m.group(1)), key) for key in conversation if (m := _SESSION_KEY.fullmatch(key)))
    dated = {key[: -len("_date_time")] for key in conversation if key.endswith("_date_time")}
    stats["sessions_without_turns"] += len(dated - {key for _, key in sessions if conversation[key]})
    messages: list[Message] = []
    seen: dict[str, str] = {}
    for _, session in sessions:
        turns = conversation[session]
        label = f"{sample} {session}"
        if not isinstance(turns, list):
            raise DatasetError(path, label, f"expected a list of turns, got {type(turns).__name__}")
        if not turns:
            continue
        raw_time = conversation.get(f"{session}_date_time")
        session_time: datetime | None = None
        if raw_time is not None or not all(isinstance(t, dict) and t.get("date_time") for t in turns):
            session_time = parse_timestamp(
                raw_time, path=path, record=f"{label}_date_time", formats=SESSION_TIME_FORMATS
            )
        for index, turn in enumerate(turns):
            turn_label = f"{label} turn {index}"
            dia_id = _require(turn, "dia_id", path, turn_label)
            speaker = _require(turn, "speaker", path, f"{turn_label} ({dia_id})")
            if dia_id in seen:
                raise DatasetError(path, turn_label, f"duplicate dia_id {dia_id!r} (also in {seen[dia_id]})")
            seen[dia_id] = session
            timestamp = session_time
            if turn.get("date_time"):
                timestamp = parse_timestamp(
                    turn["date_time"],
                    path=path,
                    record=f"{turn_label} ({dia_id}) date_time",
                    formats=TURN_TIME_FORMATS,
                    dayfirst=True,
                )
                stats["turns_with_own_time"] += 1
            stats["image_turns"] += bool(turn.get("blip_caption"))
            messages.append(Message(len(messages), str(dia_id), _turn_text(turn), timestamp, str(speaker), session))
    return messages


def _refs(token: str) -> tuple[list[str], str, str | None]:
    """``(dia_ids, quirk, unresolved kind)`` for one evidence token (see the module docstring)."""
    stripped = token.strip(".;:,()[]")
    quirk = "trailing_punctuation" if stripped != token else ""
    if match := _EVIDENCE_REF.fullmatch(stripped):
        ref = f"D{match.group(1)}:{match.group(2)}"
        return [ref], quirk or ("repaired_colon" if ref != stripped else ""), None
    if match := _JOINED_REFS.fullmatch(stripped):
        return [f"D{match.group(1)}:{match.group(2)}", f"D{match.group(3)}:{match.group(4)}"], "joined_refs", None
    if match := _RANGE.fullmatch(stripped):
        dialogue, first, other, last = match.group(1), int(match.group(2)), match.group(3), int(match.group(4))
        if (other is not None and other != dialogue) or last < first:
            return [], "", "cross_dialogue_range"
        return [f"D{dialogue}:{turn}" for turn in range(first, last + 1)], "range", None
    return [], "", "bare_number" if stripped.isdigit() else "malformed"


def resolve_evidence(entries: Iterable, memory: Memory, stats: Counter) -> tuple[list[int], list[str]]:
    """Message ids for LoCoMo evidence entries, and the raw refs that match no turn."""
    ids: list[int] = []
    unresolved: list[str] = []
    quirks, kinds = stats.setdefault("evidence_quirks", Counter()), stats.setdefault("unresolved_by_kind", Counter())
    for entry in entries:
        # "D12:3 - D12:5" is one range, not three tokens.
        tokens = [t for t in re.split(r"[;,\s]+", re.sub(r"\s*-\s*", "-", str(entry).strip())) if t]
        stats["split_evidence"] += len(tokens) > 1
        if not tokens:
            unresolved.append(str(entry))
            kinds["malformed"] += 1
        for token in tokens:
            refs, quirk, kind = _refs(token)
            found = [memory.id_of(ref) for ref in refs]
            if kind is None and (not found or found[0] is None or found[-1] is None):
                kind = "no_such_turn"  # a ref, or a range end, the conversation does not have
            if kind is not None:
                unresolved.append(token)
                kinds[kind] += 1
                continue
            if quirk:
                quirks[quirk] += 1
                stats["repaired_evidence"] += quirk == "repaired_colon"
            ids.extend(i for i in found if i is not None)
    return sorted(set(ids)), unresolved


def load_locomo(
    path: str,
    granularity: str = "day",
    merge_gap=None,
    max_windows: int | None = None,
    non_temporal_categories: Iterable[str] = (),
) -> Dataset:
    """Load a LoCoMo JSON file (``locomo10.json`` or a subset of it)."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, list):
        raise DatasetError(path, "file", f"expected a JSON list of conversations, got {type(data).__name__}")
    non_temporal = {str(c) for c in non_temporal_categories}
    gold_rule = {"merge_gap": merge_gap, "max_windows": max_windows, "non_temporal": non_temporal}
    stats: Counter = Counter()
    memories: dict[str, Memory] = {}
    queries: list[Query] = []
    for position, sample in enumerate(data):
        label = f"sample {position}"
        conversation = _require(sample, "conversation", path, label)
        qa = _require(sample, "qa", path, label)
        sample_id = str(sample.get("sample_id", f"conv-{position}"))
        label = f"{label} ({sample_id})"
        if not isinstance(conversation, dict) or not isinstance(qa, list):
            raise DatasetError(path, label, "'conversation' must be an object and 'qa' a list")
        if sample_id in memories:
            raise DatasetError(path, label, f"duplicate sample_id {sample_id!r}")
        messages = _messages(conversation, sample_id, path, stats)
        if not messages:
            raise DatasetError(path, label, "conversation has no turns")
        memory = memories[sample_id] = Memory(sample_id, messages, granularity)
        asked_at = memory.timestamps[-1]
        for index, item in enumerate(qa):
            queries.append(_query(item, index, memory, asked_at, path, stats, **gold_rule))
    stats = {k: dict(sorted(v.items())) if isinstance(v, Counter) else v for k, v in sorted(stats.items())}
    return Dataset("locomo", granularity, memories, queries, stats)


def _query(
    item, index: int, memory: Memory, asked_at, path: Path, stats: Counter, *, merge_gap, max_windows, non_temporal
) -> Query:
    """The ``qa[index]`` item of ``memory``'s sample as a ``Query`` asked at ``asked_at``;
    ``non_temporal``: the categories whose questions are non-temporal."""
    sample_id, granularity = memory.key, memory.granularity
    q_label = f"{sample_id} qa[{index}]"
    question = _require(item, "question", path, q_label)
    category = str(_require(item, "category", path, q_label))
    evidence = item.get("evidence") or []
    evidence_ids, unresolved = resolve_evidence([evidence] if isinstance(evidence, str) else evidence, memory, stats)
    stats["unresolved_evidence"] += len(unresolved)
    stats["evidence_refs"] += len(evidence_ids) + len(unresolved)
    temporal, windows = gold_windows(
        (memory[i].timestamp for i in evidence_ids),
        granularity,
        merge_gap=merge_gap,
        max_windows=max_windows,
        non_temporal=category in non_temporal,
    )
    answer = item.get("answer")
    if answer is None and "adversarial_answer" in item:
        answer = LOCOMO_ADVERSARIAL_ANSWER
    if answer is None:
        raise DatasetError(path, q_label, "missing key 'answer' (and no 'adversarial_answer')")
    adversarial = item.get("adversarial_answer")
    gold = Gold(
        answer=str(answer),
        evidence_ids=tuple(evidence_ids),
        windows=windows,
        temporal=temporal,
        unresolved_evidence=tuple(unresolved),
        adversarial_answer=None if adversarial is None else str(adversarial),
    )
    return Query(f"{sample_id}:q{index:04d}", sample_id, str(question), asked_at, None, category, gold)
