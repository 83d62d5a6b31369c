"""On-disk cache of LLM completions, keyed by a hash of model + prompt + sampling settings.

SQLite (one file, WAL journal) so several threads and a resumed process share it safely.
Only successful completions are stored: a failed call is retried on the next run.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any


def cache_key(payload: dict) -> str:
    """Stable sha256 of a JSON-serialisable request description."""
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class LLMCache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("CREATE TABLE IF NOT EXISTS completions (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self._conn.commit()

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._conn.execute("SELECT value FROM completions WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        blob = json.dumps(value, ensure_ascii=False)
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO completions (key, value) VALUES (?, ?)", (key, blob))
            self._conn.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM completions").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()
