"""Parse a JSON object out of free model text: typed failures, never exceptions.

Models wrap JSON in ``<think>`` blocks, code fences or chatter; we take the first
balanced ``{...}`` that parses after the last ``</think>``.
"""

from __future__ import annotations

import json
import re
from typing import Any

_THINK_END = "</think>"
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def strip_think(text: str) -> str:
    """Drop everything up to the last ``</think>`` (Qwen3 reasoning)."""
    i = text.rfind(_THINK_END)
    return text[i + len(_THINK_END) :] if i >= 0 else text


def _balanced_objects(text: str):
    """Yield substrings that are brace-balanced ``{...}`` (string-aware)."""
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        depth, in_str, escape = 0, False, False
        for j in range(start, len(text)):
            ch = text[j]
            if in_str:
                if escape:
                    escape = False
                elif ch == "\\":
                    escape = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    yield text[start : j + 1]
                    break


def parse_json_object(text: str, schema: dict | None = None) -> tuple[Any | None, str | None]:
    """Returns ``(obj, None)`` or ``(None, reason)`` with reason one of
    ``empty_output``, ``no_json``, ``schema_mismatch: ...``."""
    body = strip_think(text or "").strip()
    if not body:
        return None, "empty_output"
    candidates = [m.group(1) for m in _FENCE.finditer(body)] + [body] + list(_balanced_objects(body))
    first_error = None
    for candidate in candidates:
        try:
            obj = json.loads(candidate)
        except (json.JSONDecodeError, ValueError):
            continue
        if not isinstance(obj, dict):
            continue
        if schema is not None:
            error = schema_error(obj, schema)
            if error:
                first_error = first_error or error
                continue
        return obj, None
    return None, first_error or "no_json"


def schema_error(obj: Any, schema: dict) -> str | None:
    import jsonschema

    try:
        jsonschema.validate(obj, schema)
    except jsonschema.ValidationError as exc:
        return f"schema_mismatch: {exc.message[:200]}"
    return None
