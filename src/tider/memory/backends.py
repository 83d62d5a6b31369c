"""Where named memories live: a directory of embedded stores, or a PostgreSQL database.

``open_backend(store)`` takes what ``--store`` / ``TIDER_STORE`` say: a PostgreSQL URL
(``postgresql://...``: every memory in that database, shared by every process that opens
it) or a directory (one embedded store per memory, ``DIR/<name>``, "/" as "+", one process at a
time). The HTTP service, ``tider memory import`` and the evaluation harness open memories
through this, so they run on either.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tider.memory.base import MemoryBase
from tider.memory.embedded import EmbeddedMemory
from tider.memory.pg import is_database_url

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

    def folder(self, name: str) -> Path:
        """``root/NAME``, a "/" in the name a "+" (a character names never hold): one folder
        per memory, never one inside another's."""
        return self.root / name.replace("/", "+")

    def open(self, name: str, **kwargs) -> MemoryBase:
        return EmbeddedMemory(self.folder(name), name=name, **kwargs)

    def exists(self, name: str) -> bool:
        return (self.folder(name) / "tider_memory.json").exists()

    def names(self) -> list[str]:
        return sorted(p.name.replace("+", "/") for p in self.root.iterdir() if (p / "tider_memory.json").exists())

    def reachable(self) -> bool:
        return self.root.is_dir()

    def drop(self, name: str) -> None:
        """Delete memory ``name`` (none there: nothing to do)."""
        shutil.rmtree(self.folder(name), ignore_errors=True)

    def swap(self, new: str, name: str) -> None:
        """Memory ``new`` becomes ``name``, replacing it (``tider.memory.reindex``). The old
        one is set aside, not deleted, until the new one is in its place."""
        from tider.memory.files import StoreFiles

        old_manifest = StoreFiles(self.folder(name))  # the locks: nobody has either open
        try:
            kept = (old_manifest.read_manifest() or {}).get("name", name)  # the memory keeps its name
        finally:
            old_manifest.close()
        files = StoreFiles(self.folder(new))
        try:
            files.commit({**files.read_manifest(), "name": kept})
        finally:
            files.close()
        aside = self.root / f".{self.folder(name).name}.old"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(self.folder(name), aside)
        os.rename(self.folder(new), self.folder(name))
        shutil.rmtree(aside)

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

    def open(self, name: str, **kwargs) -> MemoryBase:
        from tider.memory.pg.memory import PostgresMemory

        return PostgresMemory(self.url, name=name, postgres=self.postgres, **kwargs)

    def exists(self, name: str) -> bool:
        with self.pool.connection() as conn:
            return conn.execute("SELECT 1 FROM tider_memories WHERE name = %s", (name,)).fetchone() is not None

    def names(self) -> list[str]:
        with self.pool.connection() as conn:
            return [r[0] for r in conn.execute("SELECT name FROM tider_memories ORDER BY name").fetchall()]

    def reachable(self) -> bool:
        return self.pool.reachable()

    def drop(self, name: str) -> None:
        """Delete memory ``name``, its rows and its HNSW index (none there: nothing to do)."""
        with self.pool.connection() as conn, conn.transaction():
            _drop_memory(conn, name)

    def swap(self, new: str, name: str) -> None:
        """Memory ``new`` becomes ``name``, replacing it, in one transaction: a reader sees
        the old memory or the new one."""
        with self.pool.connection() as conn, conn.transaction():
            _drop_memory(conn, name)
            conn.execute("UPDATE tider_memories SET name = %s WHERE name = %s", (name, new))

    def close(self) -> None:
        from tider.memory.pg.pool import release

        if self.pool is not None:
            release(self.pool)
            self.pool = None


def _drop_memory(conn, name: str) -> None:
    from tider.memory.pg.write import hnsw_name

    row = conn.execute("SELECT id FROM tider_memories WHERE name = %s FOR UPDATE", (name,)).fetchone()
    if row is not None:
        conn.execute(f"DROP INDEX IF EXISTS {hnsw_name(row[0])}")  # a partial index outlives its rows
        conn.execute("DELETE FROM tider_memories WHERE id = %s", (row[0],))


def open_backend(store: str | os.PathLike, postgres=None) -> DirectoryBackend | DatabaseBackend:
    """The backend ``store`` names: a PostgreSQL URL, else a directory."""
    if is_database_url(store):
        return DatabaseBackend(str(store), postgres)
    return DirectoryBackend(store)
