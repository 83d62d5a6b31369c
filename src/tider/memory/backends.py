"""Where named memories live: a directory of embedded stores, or a PostgreSQL database.

``open_backend(store)`` takes what ``--store`` / ``TIDER_STORE`` say: a PostgreSQL URL
(``postgresql://...``: every memory in that database, shared by every process that opens
it) or a directory (one embedded store per memory, ``DIR/<name>``, one process at a
time). The HTTP service, ``tider memory import`` and the evaluation harness open memories
through this, so they run on either.
"""

from __future__ import annotations

import os
from pathlib import Path

from tider.memory.pg import is_database_url
from tider.memory.temporal_memory import TemporalMemory

ENV = "TIDER_STORE"


def default_store() -> str | None:
    """``$TIDER_STORE`` (a URL or a directory), if set."""
    return os.environ.get(ENV) or None


class DirectoryBackend:
    """Embedded stores, one directory per memory under ``root`` (created on first add)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return str(self.root)

    def open(self, name: str, **kwargs) -> TemporalMemory:
        return TemporalMemory(self.root / name, name=name, **kwargs)

    def exists(self, name: str) -> bool:
        return (self.root / name / "tider_memory.json").exists()

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if (p / "tider_memory.json").exists())

    def reachable(self) -> bool:
        return self.root.is_dir()

    def close(self) -> None:
        pass


class DatabaseBackend:
    """Every memory of one PostgreSQL database (``tider.memory.pg``), over one shared pool."""

    def __init__(self, url: str, postgres=None):
        from tider.memory.pg.config import PostgresConfig
        from tider.memory.pg.pool import acquire

        self.url, self.postgres = url, postgres or PostgresConfig()
        self.pool = acquire(url, self.postgres)

    def describe(self) -> str:
        return self.pool.where

    def open(self, name: str, **kwargs) -> TemporalMemory:
        return TemporalMemory(self.url, name=name, postgres=self.postgres, **kwargs)

    def exists(self, name: str) -> bool:
        with self.pool.connection() as conn:
            return conn.execute("SELECT 1 FROM tider_memories WHERE name = %s", (name,)).fetchone() is not None

    def names(self) -> list[str]:
        with self.pool.connection() as conn:
            return [r[0] for r in conn.execute("SELECT name FROM tider_memories ORDER BY name").fetchall()]

    def reachable(self) -> bool:
        return self.pool.reachable()

    def close(self) -> None:
        from tider.memory.pg.pool import release

        if self.pool is not None:
            release(self.pool)
            self.pool = None


def open_backend(store: str | os.PathLike, postgres=None) -> DirectoryBackend | DatabaseBackend:
    """The backend ``store`` names: a PostgreSQL URL, else a directory."""
    if is_database_url(store):
        return DatabaseBackend(str(store), postgres)
    return DirectoryBackend(store)
