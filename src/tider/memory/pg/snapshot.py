"""Reads of one memory inside one snapshot.

Each search reads one REPEATABLE READ, read-only transaction, so the window source's view
of the memory, the channels and the returned messages agree while other processes write.
A thread that is already inside a snapshot (``context`` builds a forest from one) reuses
it. On the HNSW path the lexical list runs on a second connection that imports the same
snapshot (``pg_export_snapshot``), beside the dense walk.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

from tider.memory.pg.rank import MemoryRow


@dataclass
class Snapshot:
    """One read: a connection inside a read-only REPEATABLE READ transaction, and the memory's row."""

    conn: object
    row: MemoryRow | None


class Snapshots:
    def __init__(self, pool, name: str):
        self.pool, self.name = pool, name
        self._local = threading.local()

    @contextlib.contextmanager
    def read(self):
        """This thread's snapshot, or a new one for the duration."""
        current = getattr(self._local, "snapshot", None)
        if current is not None:
            yield current
            return
        with self.pool.connection() as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                self._local.snapshot = Snapshot(conn, MemoryRow.read(conn, self.name))
                yield self._local.snapshot
            finally:
                self._local.snapshot = None
                if not conn.closed:
                    conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def side(self, snap: Snapshot, wanted: bool):
        """``run(fn, *args)``: ``fn(connection, *args)`` on a second connection reading
        ``snap``'s snapshot, for the lexical list to run beside the dense walk (its
        transaction opens and closes in the caller's thread, off the walk's path); None
        when not ``wanted`` or the pool has no connection free."""
        if not wanted:
            yield None
            return
        with self.pool.spare() as conn:
            if conn is None:
                yield None
                return
            from psycopg import sql as pgsql

            exported = snap.conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
            begin = pgsql.SQL("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}").format(
                pgsql.Literal(exported)
            )

            def run(fn, *args):
                conn.execute(begin)
                try:
                    return fn(conn, *args)
                finally:
                    if not conn.closed:
                        conn.execute("ROLLBACK")

            yield run
