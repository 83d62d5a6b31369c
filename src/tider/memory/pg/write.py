"""An add as one transaction, and the HNSW index a memory gets when it grows.

``add`` locks the memory's row (``SELECT ... FOR UPDATE``), so adds to one memory run one
at a time in every process, while adds to other memories and all searches go on. Inside:

1. keys the memory already holds are dropped (re-adding is a no-op); the insert is also
   ``ON CONFLICT (memory_id, key) DO NOTHING``, the unique key being the last word;
2. the new messages get ``seq`` (a bigserial, so insertion order) and their positions in
   (timestamp, seq) order: appended after the last stored position (gaps a delete left
   included, ``tider.memory.pg.gaps``) when none is older than the newest stored message,
   else the positions from the first changed one on are renumbered densely in the same
   transaction, closing the gaps there (the embedded store rebuilds its time-ordered views
   the same way);
3. BM25 postings (term frequency, document length) and document frequencies are written,
   the long messages' chunk vectors, and the corpus statistics (message count, summed
   lengths) updated;
4. the timeline re-merges from the cluster holding the first changed position
   (``tider.retrieval.timeline.cluster_messages``, the embedded store's code);
5. ``version`` is bumped and the transaction commits: a reader sees all of it or none.

Commit is durability: PostgreSQL has the add in its write-ahead log when ``add`` returns,
so killing the writer (or the server: crash recovery replays the log) loses nothing
acknowledged. Embedding, the slow part, runs before the lock.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from psycopg.types.json import Jsonb

from tider.memory.files import StoreError
from tider.retrieval.config import RetrievalConfig
from tider.types import Message

HNSW_LOCK = 0x74696465  # pg_try_advisory_lock(HNSW_LOCK, memory id): one index builder per memory
MESSAGE_COLUMNS = (
    "key",
    "ts",
    "text",
    "speaker",
    "session",
    "channel",
    "topic",
    "phase",
    "role",
    "stage",
    "metadata",
    "doc_length",
    "embedding",
)


@dataclass
class Fresh:
    """Messages to add (input order), their vectors and BM25 terms, and the chunk vectors
    of the long ones with the index of the message each belongs to."""

    messages: list[Message]
    vectors: np.ndarray
    terms: list[list[str]]
    chunk_vectors: np.ndarray | None = None
    chunk_owners: np.ndarray | None = None

    def doc_lengths(self) -> list[int]:
        # bm25s indexes an empty document as one placeholder token: length 1, as here
        return [max(len(t), 1) for t in self.terms]

    def keep(self, keys: set[str]) -> Fresh:
        picks = [i for i, m in enumerate(self.messages) if m.key in keys]
        kept = Fresh([self.messages[i] for i in picks], self.vectors[picks], [self.terms[i] for i in picks])
        if self.chunk_owners is not None and len(self.chunk_owners):
            new_index = np.full(len(self.messages), -1, dtype=np.int64)
            new_index[picks] = np.arange(len(picks))
            owners = new_index[self.chunk_owners]
            kept.chunk_vectors, kept.chunk_owners = self.chunk_vectors[owners >= 0], owners[owners >= 0]
        return kept


def as_array(vector) -> np.ndarray:
    """A pgvector value as float32 numpy."""
    return np.asarray(vector.to_numpy() if hasattr(vector, "to_numpy") else vector, dtype=np.float32)


def bm25_terms(messages: Sequence[Message], config: RetrievalConfig) -> list[list[str]]:
    """The embedded store's BM25 terms of each message: metadata-expanded, through the
    memory's lexical analysis (stems stored, so both backends index the same terms)."""
    from tider.retrieval.bm25 import expand_message

    analysis = config.lexical()
    return [analysis.terms(expand_message(m, config.metadata_fields)) for m in messages]


def existing_keys(conn, memory_id: int, keys: Sequence[str]) -> set[str]:
    rows = conn.execute(
        "SELECT key FROM tider_messages WHERE memory_id = %s AND key = ANY(%s)", (memory_id, list(keys))
    ).fetchall()
    return {r[0] for r in rows}


def commit_add(conn, memory_id: int, fresh: Fresh, config: RetrievalConfig, embedding: dict) -> int:
    """Add ``fresh`` to memory ``memory_id`` in one transaction; returns how many were new."""
    with conn.transaction():
        n, gaps, max_ts, dim = conn.execute(
            "SELECT n_messages, gaps, max_ts, dim FROM tider_memories WHERE id = %s FOR UPDATE", (memory_id,)
        ).fetchone()
        present = existing_keys(conn, memory_id, [m.key for m in fresh.messages])  # added meanwhile
        fresh = fresh.keep({m.key for m in fresh.messages} - present)
        if not fresh.messages:
            return 0
        if dim is not None and fresh.vectors.shape[1] != dim:
            raise StoreError(f"memory {memory_id}: vectors of dimension {fresh.vectors.shape[1]}, it holds {dim}")
        oldest = min(m.timestamp for m in fresh.messages)
        in_order = max_ts is None or oldest >= max_ts
        span = n + gaps  # stored positions in use, holes included: an in-order add appends there
        first_changed = span if in_order else _first_after(conn, memory_id, oldest)
        placed = _insert_messages(conn, memory_id, fresh, span if in_order else None)
        _insert_postings(conn, memory_id, fresh, placed)
        _insert_chunks(conn, memory_id, fresh, placed)
        if not in_order:
            _renumber(conn, memory_id, first_changed, oldest)
        seqs = {key: seq for key, (seq, _) in placed.items()}
        lengths = fresh.doc_lengths()
        conn.execute(
            "UPDATE tider_memories SET n_messages = n_messages + %s, total_length = total_length + %s, "
            "max_ts = greatest(max_ts, %s), dim = %s, embedding = %s, version = version + 1 WHERE id = %s",
            (
                len(fresh.messages),
                sum(lengths),
                max(m.timestamp for m in fresh.messages),
                fresh.vectors.shape[1],
                json.dumps({**embedding, "dim": int(fresh.vectors.shape[1])}),
                memory_id,
            ),
        )
        extend_timeline(conn, memory_id, first_changed, fresh, seqs, config)
        return len(fresh.messages)


def _first_after(conn, memory_id: int, ts: datetime) -> int:
    """Position of the first stored message later than ``ts`` (where an older add lands)."""
    row = conn.execute(
        "SELECT pos FROM tider_messages WHERE memory_id = %s AND ts > %s ORDER BY ts, seq LIMIT 1", (memory_id, ts)
    ).fetchone()
    return int(row[0])


def _insert_messages(conn, memory_id: int, fresh: Fresh, append_at: int | None) -> dict[str, int]:
    """Insert in input order (so ``seq`` follows it); positions appended after ``append_at``
    messages, or -1 for ``_renumber`` to set. Returns ``{key: (seq, position)}``."""
    msgs = fresh.messages
    pos = [-1] * len(msgs)
    if append_at is not None:
        for j, i in enumerate(sorted(range(len(msgs)), key=lambda i: (msgs[i].timestamp, i))):
            pos[i] = append_at + j
    columns = ", ".join(MESSAGE_COLUMNS)
    conn.execute(
        "CREATE TEMP TABLE tider_staging (ord integer, pos bigint, key text, ts timestamp, text text, "
        "speaker text, session text, channel text, topic text, phase text, role text, stage integer, "
        "metadata jsonb, doc_length integer, embedding vector) ON COMMIT DROP"
    )
    with conn.cursor().copy(f"COPY tider_staging (ord, pos, {columns}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["int4", "int8", "text", "timestamp", *["text"] * 7, "int4", "jsonb", "int4", "vector"])
        for i, (m, length) in enumerate(zip(msgs, fresh.doc_lengths())):
            copy.write_row(
                (i, pos[i], m.key, m.timestamp, m.text, m.speaker, m.session, m.channel, m.topic, m.phase, m.role)
                + (m.stage, Jsonb(dict(m.metadata)), length, fresh.vectors[i])
            )
    rows = conn.execute(
        f"INSERT INTO tider_messages (memory_id, pos, {columns}) SELECT %s, pos, {columns} FROM tider_staging "
        "ORDER BY ord ON CONFLICT (memory_id, key) DO NOTHING RETURNING key, seq, pos",
        (memory_id,),
    ).fetchall()
    if len(rows) != len(msgs):  # the row lock makes this impossible; refuse rather than leave a gap
        raise StoreError(f"memory {memory_id}: {len(msgs) - len(rows)} keys appeared during the add; retry it")
    return {key: (seq, p) for key, seq, p in rows}


def _renumber(conn, memory_id: int, first_changed: int, oldest: datetime) -> None:
    """Positions from ``first_changed`` on: the stored messages later than ``oldest`` and
    the new ones (-1), in (timestamp, seq) order, dense (the gaps there close); then their
    postings' copies."""
    conn.execute(
        "UPDATE tider_messages m SET pos = r.p FROM (SELECT seq, %s + row_number() OVER (ORDER BY ts, seq) - 1 AS p "
        "FROM tider_messages WHERE memory_id = %s AND (ts > %s OR pos < 0)) r "
        "WHERE m.memory_id = %s AND m.seq = r.seq AND m.pos <> r.p",
        (first_changed, memory_id, oldest, memory_id),
    )
    conn.execute(
        "UPDATE tider_postings p SET pos = m.pos FROM tider_messages m WHERE p.memory_id = %s AND m.memory_id = %s "
        "AND m.pos >= %s AND p.seq = m.seq AND p.pos <> m.pos",
        (memory_id, memory_id, first_changed),
    )
    closed = conn.execute("DELETE FROM tider_gaps WHERE memory_id = %s AND pos >= %s", (memory_id, first_changed))
    if closed.rowcount:
        conn.execute("UPDATE tider_memories SET gaps = gaps - %s WHERE id = %s", (closed.rowcount, memory_id))


def _insert_chunks(conn, memory_id: int, fresh: Fresh, placed: dict[str, tuple[int, int]]) -> None:
    """The long messages' chunk vectors, by their message's ``seq`` (which no renumbering moves)."""
    if fresh.chunk_owners is None or not len(fresh.chunk_owners):
        return
    with conn.cursor().copy("COPY tider_chunks (memory_id, seq, chunk, embedding) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "int8", "int4", "vector"])
        previous, chunk = -1, 0
        for owner, vector in zip(fresh.chunk_owners.tolist(), fresh.chunk_vectors):
            chunk = chunk + 1 if owner == previous else 1  # chunk 0 is the message's own vector
            previous = owner
            copy.write_row((memory_id, placed[fresh.messages[owner].key][0], chunk, vector))


def _insert_postings(conn, memory_id: int, fresh: Fresh, placed: dict[str, tuple[int, int]]) -> None:
    """Postings carry their message's position (kept in step by ``_renumber``), so the
    lexical list needs no lookup per message; and document frequencies."""
    df: Counter = Counter()
    with conn.cursor().copy(
        "COPY tider_postings (memory_id, term, seq, pos, ts, tf, doc_length) FROM STDIN (FORMAT BINARY)"
    ) as copy:
        copy.set_types(["int8", "text", "int8", "int8", "timestamp", "int4", "int4"])
        for m, terms, length in zip(fresh.messages, fresh.terms, fresh.doc_lengths()):
            counts = Counter(terms)
            df.update(counts.keys())
            seq, pos = placed[m.key]
            for term, tf in counts.items():
                copy.write_row((memory_id, term, seq, pos, m.timestamp, tf, length))
    if df:
        terms = sorted(df)
        conn.execute(
            "INSERT INTO tider_terms (memory_id, term, df) SELECT %s, t, d FROM unnest(%s::text[], %s::bigint[]) "
            "AS u(t, d) ON CONFLICT (memory_id, term) DO UPDATE SET df = tider_terms.df + EXCLUDED.df",
            (memory_id, terms, [df[t] for t in terms]),
        )


def extend_timeline(conn, memory_id: int, first_changed: int, fresh: Fresh, seqs: dict, config) -> None:
    """Re-merge the timeline from the cluster holding position ``first_changed - 1`` (all of
    it when that is 0), as ``Timeline.extend`` does; the new messages' vectors are in hand,
    the stored ones are read from that cluster's start on."""
    from tider.retrieval.timeline import centroids, cluster_messages

    start = 0
    if first_changed > 0:
        row = conn.execute(
            "SELECT start_pos FROM tider_timeline WHERE memory_id = %s AND start_pos <= %s "
            "ORDER BY start_pos DESC LIMIT 1",
            (memory_id, first_changed - 1),
        ).fetchone()
        start = int(row[0]) if row else 0
    new_seqs = {seqs[m.key]: i for i, m in enumerate(fresh.messages)}
    rows = (
        conn.cursor(binary=True)
        .execute(  # seqs are given under the row lock: the new ones are the largest
            "SELECT pos, seq, ts, CASE WHEN seq >= %s THEN NULL ELSE embedding END FROM tider_messages "
            "WHERE memory_id = %s AND pos >= %s ORDER BY pos",
            (min(new_seqs), memory_id, start),
        )
        .fetchall()
    )
    vectors = np.stack([fresh.vectors[new_seqs[seq]] if vec is None else as_array(vec) for _, seq, _, vec in rows])
    clusters = cluster_messages([r[2] for r in rows], vectors.astype(np.float32), config.timeline)
    conn.execute("DELETE FROM tider_timeline WHERE memory_id = %s AND start_pos >= %s", (memory_id, start))
    write_clusters(conn, memory_id, [rows[c[0]][0] for c in clusters], centroids(vectors.astype(np.float32), clusters))


def write_clusters(conn, memory_id: int, starts, centres) -> None:
    """Timeline rows: each cluster's first stored position and its centroid."""
    if not len(starts):
        return
    with conn.cursor().copy("COPY tider_timeline (memory_id, start_pos, centroid) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "int8", "vector"])
        for start, centre in zip(starts, centres):
            copy.write_row((memory_id, int(start), centre))


def hnsw_name(memory_id: int) -> str:
    return f"tider_hnsw_{int(memory_id)}"


def hnsw_state(conn, memory_id: int) -> bool | None:
    """True: the memory's HNSW index is usable; False: a failed build left it invalid; None: none."""
    row = conn.execute(
        "SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid WHERE c.relname = %s",
        (hnsw_name(memory_id),),
    ).fetchone()
    return None if row is None else bool(row[0])


def memory_row(conn, name: str, granularity: str, config_json: str) -> tuple[int, dict]:
    """``(id, stored config)`` of memory ``name``, its row created with this config if new."""
    conn.execute(
        "INSERT INTO tider_memories (name, granularity, config) VALUES (%s, %s, %s) ON CONFLICT (name) DO NOTHING",
        (name, granularity, config_json),
    )
    return conn.execute("SELECT id, config FROM tider_memories WHERE name = %s", (name,)).fetchone()


def index_when_grown(conn, memory_id: int, dim: int, min_messages: int, pg) -> None:
    """The HNSW index (``ensure_hnsw``, ``pg``'s settings) once the memory holds ``min_messages``."""
    n = conn.execute("SELECT n_messages FROM tider_memories WHERE id = %s", (memory_id,)).fetchone()[0]
    if n >= min_messages:
        ensure_hnsw(conn, memory_id, dim, pg.hnsw_m, pg.hnsw_ef_construction, pg.maintenance_work_mem)


def ensure_hnsw(conn, memory_id: int, dim: int, m: int, ef: int, maintenance_work_mem: str) -> bool:
    """Build the memory's HNSW index (a partial expression index over its rows) unless it
    exists or another process is building it. ``CREATE INDEX CONCURRENTLY``: adds and
    searches go on meanwhile. Returns whether it was built here."""
    if hnsw_state(conn, memory_id):
        return False
    if not conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (HNSW_LOCK, memory_id)).fetchone()[0]:
        return False
    name, timeout = hnsw_name(memory_id), None
    try:
        if hnsw_state(conn, memory_id) is False:  # a build that died half way leaves an invalid index
            conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        if hnsw_state(conn, memory_id):
            return False
        timeout = conn.execute("SELECT current_setting('statement_timeout')").fetchone()[0]
        conn.execute("SELECT set_config('maintenance_work_mem', %s, false)", (maintenance_work_mem,))
        conn.execute("SET statement_timeout = 0")
        conn.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON tider_messages USING hnsw "
            f"((embedding::halfvec({int(dim)})) halfvec_ip_ops) WITH (m = {int(m)}, "
            f"ef_construction = {int(ef)}) WHERE memory_id = {int(memory_id)}"
        )
        return True
    finally:
        conn.execute("RESET maintenance_work_mem")
        if timeout is not None:
            conn.execute("SELECT set_config('statement_timeout', %s, false)", (timeout,))
        conn.execute("SELECT pg_advisory_unlock(%s, %s)", (HNSW_LOCK, memory_id))
