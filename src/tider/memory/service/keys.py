"""Who may read and write which memories of the HTTP service: bearer keys bound to scopes.

A memory is a scope (one user's, one agent's, one session's timeline: its name says whose,
e.g. ``alice.assistant``), so a key is bound to memory-name patterns (``fnmatch``), one
list for reading (``GET``, search) and one for writing (add, update, delete)::

    {"keys": [{"key": "sk-alice", "read": ["alice.*"], "write": ["alice.*"]},
              {"key": "sk-audit", "read": ["*"], "write": []}]}

``tider memory serve`` reads that file from ``$TIDER_API_KEYS``; ``$TIDER_API_KEY`` stays
one key with every scope. A request without a known key is 401; one outside its key's
scopes is 403, and ``GET /memories`` lists only the memories the key may read. No key
configured: the service is open (it binds to 127.0.0.1 unless told otherwise). The LLM
provider's key is another setting (``--api-key-env``, ``OPENAI_API_KEY``).
"""

from __future__ import annotations

import fnmatch
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path

KEYS_ENV, KEY_ENV = "TIDER_API_KEYS", "TIDER_API_KEY"


# A memory's name, as the service accepts it: up to 200 characters in "/"-separated parts,
# so scopes such as "user:alice/agent:support/session:9f1c2e4a-..." (UUIDs) fit. A part is
# never a word the routes put after a name (``ROUTE_WORDS``), so a path splits one way
# (``/memories/user:alice/agent:x/messages/KEY``); a directory store makes "/" a "+" in the
# folder name (at most 255 bytes).
ROUTE_WORDS = ("messages", "search", "delete")
_PART = r"[A-Za-z0-9][A-Za-z0-9._:@-]*"
_NOT_A_WORD = rf"(?!(?:{'|'.join(ROUTE_WORDS)})(?:/|$))"
NAME = rf"^(?=.{{1,200}}$){_NOT_A_WORD}{_PART}(?:/{_NOT_A_WORD}{_PART})*$"
# NAME without its look-arounds (what pydantic's regex engine and the OpenAPI schema take,
# with ``max_length=NAME_MAX``): in a path the route words are already excluded.
NAME_SHAPE, NAME_MAX = rf"^{_PART}(?:/{_PART})*$", 200
# How a route finds a name in a path: "/"-separated parts, none of them a route word (the
# characters are checked against NAME afterwards, a 422 rather than a 404).
NAME_IN_PATH = rf"{_NOT_A_WORD}[^/]+(?:/{_NOT_A_WORD}[^/]+)*"
NAME_HELP = "memory name (up to 200 of: letters, digits, . _ - : @, and / between parts)"


class KeyFileError(ValueError):
    """A key file that cannot be used; names the file and the entry."""


@dataclass(frozen=True)
class Grant:
    read: tuple[str, ...]
    write: tuple[str, ...]

    def allows(self, name: str, mode: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in (self.read if mode == "read" else self.write))


EVERYTHING = Grant(("*",), ("*",))


class KeyRing:
    """Bearer keys and their grants; ``None`` from ``grant`` for an unknown key."""

    def __init__(self, grants: dict[str, Grant]):
        self.grants = grants

    @property
    def open(self) -> bool:
        return not self.grants

    def grant(self, token: str | None) -> Grant | None:
        if self.open:
            return EVERYTHING
        found = None
        for key, grant in self.grants.items():  # every key compared: the time says nothing
            if token is not None and hmac.compare_digest(token.encode(), key.encode()):
                found = grant
        return found

    @classmethod
    def from_env(cls, api_key: str | None = None, keys_file: str | os.PathLike | None = None) -> KeyRing:
        """``api_key`` (default ``$TIDER_API_KEY``: every scope) and the grants of
        ``keys_file`` (default ``$TIDER_API_KEYS``)."""
        api_key = api_key if api_key is not None else os.environ.get(KEY_ENV) or None
        keys_file = keys_file if keys_file is not None else os.environ.get(KEYS_ENV) or None
        grants = read_key_file(Path(keys_file)) if keys_file else {}
        if api_key:
            grants[api_key] = EVERYTHING
        return cls(grants)


def read_key_file(path: Path) -> dict[str, Grant]:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["keys"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise KeyFileError(f'{path}: expected {{"keys": [{{"key", "read", "write"}}, ...]}} ({err})') from None
    grants: dict[str, Grant] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: keys[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str) or len(entry["key"]) < 16:
            raise KeyFileError(f"{where}: needs a 'key' string of 16 characters or more")
        patterns = {m: entry.get(m, []) for m in ("read", "write")}
        if not all(isinstance(v, list) and all(isinstance(p, str) for p in v) for v in patterns.values()):
            raise KeyFileError(f"{where}: 'read' and 'write' are lists of memory-name patterns")
        if entry["key"] in grants:
            raise KeyFileError(f"{where}: the same key twice")
        grants[entry["key"]] = Grant(tuple(patterns["read"]), tuple(patterns["write"]))
    return grants


def register_name_convertor() -> None:
    """``{name:memory}`` in a route: a memory name that may hold "/" (``NAME_IN_PATH``)."""
    from starlette.convertors import CONVERTOR_TYPES, Convertor, register_url_convertor

    class MemoryName(Convertor):
        regex = NAME_IN_PATH

        def convert(self, value: str) -> str:
            return value

        def to_string(self, value: str) -> str:
            return value

    if "memory" not in CONVERTOR_TYPES:
        register_url_convertor("memory", MemoryName())
