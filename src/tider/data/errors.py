"""The one error type every loader raises for bad input, plus the time parser they share."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from dateutil import parser as dateutil_parser


class DatasetError(ValueError):
    """Bad input data. The message always names the file and the record (and the field)."""

    def __init__(self, path: object, record: object, problem: str):
        self.path = str(path)
        self.record = record
        self.problem = problem
        super().__init__(f"{self.path}: {record}: {problem}")


def parse_timestamp(
    text: object,
    *,
    path: object,
    record: object,
    formats: Iterable[str] = (),
    dayfirst: bool = False,
) -> datetime:
    """Parse a source timestamp into a timezone-naive ``datetime``.

    Known formats are tried first (exact and fast); python-dateutil is the fallback for
    anything else. Anything unparseable becomes a ``DatasetError`` naming file and record.
    """
    if not isinstance(text, str) or not text.strip():
        raise DatasetError(path, record, f"missing or empty timestamp ({text!r})")
    value = " ".join(text.split())
    for fmt in formats:
        try:
            return datetime.strptime(value, fmt)
        except ValueError:
            continue
    try:
        parsed = dateutil_parser.parse(value, dayfirst=dayfirst)
    except (ValueError, OverflowError) as exc:
        raise DatasetError(path, record, f"unparseable timestamp {text!r} ({exc})") from None
    # Naive UTC everywhere (docs/design.md, decision 1): convert aware times, keep naive ones.
    if parsed.tzinfo is not None:
        parsed = parsed.replace(tzinfo=None) - parsed.utcoffset()
    return parsed
