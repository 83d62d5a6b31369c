"""``TemporalMemory`` on PostgreSQL + pgvector: one memory for many processes and machines.

``TemporalMemory("postgresql://user@host/db", name="team-chat")`` keeps a memory's
messages, vectors, BM25 postings and term statistics, positions and timeline in the
database, and ranks there: pgvector for the dense channel, BM25 in SQL for the lexical
channel, an indexed time range for the windows. Python fuses the candidate lists the
database returns with the arithmetic of the embedded store (``tider.memory.index``), so
both backends rank alike. Layout:

- ``config``: ``PostgresConfig`` (pool, timeouts, HNSW search depth) and the errors;
- ``pool``: one connection pool per database URL in a process; clear, bounded failures;
- ``schema``: the tables, created and versioned by ordered migration steps;
- ``write``: an add as one transaction (positions, postings, statistics, timeline);
- ``lexical`` / ``rank``: the SQL behind each channel, and the fusion over its candidates;
- ``views``: the process's read-through copy of messages and vectors for window sources;
- ``memory``: ``PostgresMemory``, what ``TemporalMemory(url)`` returns.
"""

from __future__ import annotations

SCHEMES = ("postgresql://", "postgres://")


def is_database_url(store) -> bool:
    """True for a PostgreSQL connection URL (what ``TemporalMemory`` and ``--store`` dispatch on)."""
    return isinstance(store, str) and store.startswith(SCHEMES)
