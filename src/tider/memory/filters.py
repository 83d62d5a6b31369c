"""Filters on a memory's messages, as mem0 and Zep users pass them to search, list and delete:

    {"session": "s1" or ["s1", "s2"], "speaker": "ana" or [...], "metadata": {"ticket": 7}}

Every named part must hold (AND); a list is any of its values (OR); ``metadata`` holds when
each named field has exactly that value (a number matches an equal number: 7 == 7.0,
never the string "7"; a boolean only a boolean).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tider.memory.records import MemoryInputError, checked_metadata
from tider.types import Message

FIELDS = ("session", "speaker", "metadata")


@dataclass(frozen=True)
class Filter:
    sessions: frozenset[str] | None = None
    speakers: frozenset[str] | None = None
    metadata: tuple = ()

    def matches(self, m: Message) -> bool:
        if self.sessions is not None and m.session not in self.sessions:
            return False
        if self.speakers is not None and m.speaker not in self.speakers:
            return False
        if self.metadata:
            held = dict(m.metadata)
            return all(name in held and _same(held[name], value) for name, value in self.metadata)
        return True


def _same(a, b) -> bool:
    return isinstance(a, bool) == isinstance(b, bool) and isinstance(a, str) == isinstance(b, str) and a == b


def _values(value: Any, field: str) -> frozenset[str]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list | tuple) or not values or not all(isinstance(v, str) for v in values):
        raise MemoryInputError(field, f"expected a string or a non-empty list of strings, got {value!r}")
    return frozenset(values)


def parse_filter(value: Mapping | Filter | None) -> Filter | None:
    """``value`` as a ``Filter``; None (or an empty mapping) filters nothing."""
    if value is None or isinstance(value, Filter):
        return value
    if not isinstance(value, Mapping):
        raise MemoryInputError("filters", f"expected an object, got {type(value).__name__}")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise MemoryInputError(f"filters.{unknown[0]}", f"unknown filter; known: {', '.join(FIELDS)}")
    if not value:
        return None
    sessions = _values(value["session"], "filters.session") if value.get("session") is not None else None
    speakers = _values(value["speaker"], "filters.speaker") if value.get("speaker") is not None else None
    return Filter(sessions, speakers, checked_metadata(value.get("metadata"), "filters.metadata"))
