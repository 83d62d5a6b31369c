"""Record management as transactions: a delete, an update (``PostgresMemory._delete``,
``_replace``; the public calls are ``MemoryBase``'s).

Each runs in one transaction under the memory row's lock (``SELECT ... FOR UPDATE``, as an
add takes it), so it is serialized with every add, delete and update of that memory in
every process, and a reader sees all of it or none:

1. the messages go (their chunk vectors with them: ``ON DELETE CASCADE``), or the updated
   one is rewritten in place, keeping its ``seq`` (its insertion order, so ties of equal
   times sort as they did); their postings are deleted, document frequencies decremented
   (a term no message holds any more leaves ``tider_terms``), the corpus statistics
   (message count, summed document lengths, newest time) set to what remains; an updated
   message's postings, length and chunks are written anew;
2. positions are renumbered from the first changed one on ((timestamp, seq) order, dense);
   the postings' copies follow;
3. the timeline re-merges from the cluster holding the position before the first changed
   one (the greedy merge is left to right and restarts at every cluster it opens, so the
   clusters before are what a memory built from the survivors has);
4. ``version`` is bumped and ``rewritten`` set to it: a process's read-through copy
   (``tider.memory.pg.views``) built before is read again, not extended.

So a managed memory ranks as a fresh one built from its surviving messages in their
insertion order (same positions, statistics, timeline, scores). The HNSW index follows
the deletes itself (pgvector marks the rows dead; vacuum repairs the graph).

Deleted text: the rows are deleted when this commits and no query sees them from then on;
PostgreSQL frees the dead tuples (a deleted row, an updated row's old version, their index
entries and TOAST) on VACUUM, which autovacuum runs as the tables churn: after it the text
is no longer in any row, and the space is reused (plain VACUUM does not zero it, so the
bytes may stay in the files until overwritten; ``VACUUM FULL tider_messages,
tider_postings, tider_chunks`` rewrites the tables into new files and deletes the old).
Write-ahead log segments (until recycled) and backups keep what they recorded.

Cost: positions are dense and every posting carries its message's, so a change rewrites
the message rows and postings from the first changed position on, and the timeline
re-merges from the cluster before it: deleting the newest message is cheap, the oldest
costs about as much as the memory. Measured (10k messages of 16-d vectors, ~8 postings
each, a local server, 2 shared cores): one delete of the newest 0.1 s, of the middle one
0.75 s, of the oldest 1.3-1.4 s (renumbering 0.9 s, timeline 0.3 s); 100 keys spread
over the memory 1.3 s; a day's delete_all mid-memory 0.5 s. Many deletes cost about one
when given together (one renumbering from the first).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
from psycopg.types.json import Jsonb

from tider.memory.files import StoreError
from tider.memory.pg.write import Fresh, _insert_chunks, _insert_postings, as_array
from tider.memory.records import MessageNotFound
from tider.retrieval.config import RetrievalConfig
from tider.types import Message

STORED = "seq, pos, key, ts, text, speaker, session, channel, topic, phase, stage, role, metadata, doc_length"


def _stored_message(row) -> tuple[int, int, int, Message]:
    """``(seq, pos, doc_length, message with id = pos)`` of a ``STORED`` row."""
    seq, pos, key, ts, text, speaker, session, channel, topic, phase, stage, role, metadata, length = row
    meta = tuple(sorted(metadata.items()))
    return seq, pos, length, Message(pos, key, text, ts, speaker, session, channel, topic, phase, stage, role, meta)


def read_message(conn, memory_id: int, key: str) -> Message | None:
    """The stored message ``key`` (``id`` its position), one row read."""
    row = conn.execute(f"SELECT {STORED} FROM tider_messages WHERE memory_id = %s AND key = %s", (memory_id, key))
    found = row.fetchone()
    return None if found is None else _stored_message(found)[3]


def _lock(conn, memory_id: int) -> int | None:
    """Lock the memory's row (as an add does); its vector dimension."""
    return conn.execute("SELECT dim FROM tider_memories WHERE id = %s FOR UPDATE", (memory_id,)).fetchone()[0]


def commit_delete(
    conn, memory_id: int, keys: Sequence[str] | None, start: datetime | None, end: datetime | None, config
) -> list[str]:
    """Delete the messages ``keys`` (None: those with ``start <= ts <= end``, either end
    open) in one transaction; returns the keys deleted, in time order."""
    where, params = ["memory_id = %s"], [memory_id]
    if keys is not None:
        where.append("key = ANY(%s)")
        params.append(list(keys))
    else:
        if start is not None:
            where.append("ts >= %s")
            params.append(start)
        if end is not None:
            where.append("ts <= %s")
            params.append(end)
    with conn.transaction():
        _lock(conn, memory_id)
        gone = conn.execute(
            f"DELETE FROM tider_messages WHERE {' AND '.join(where)} RETURNING pos, key, seq, doc_length", params
        ).fetchall()
        if not gone:
            return []
        gone.sort()
        _drop_postings(conn, memory_id, [r[2] for r in gone])
        first = int(gone[0][0])
        renumber_from(conn, memory_id, first)
        conn.execute(
            "UPDATE tider_memories SET n_messages = n_messages - %s, total_length = total_length - %s, "
            "max_ts = (SELECT max(ts) FROM tider_messages WHERE memory_id = %s), version = version + 1, "
            "rewritten = version + 1 WHERE id = %s",
            (len(gone), sum(int(r[3]) for r in gone), memory_id, memory_id),
        )
        rebuild_timeline(conn, memory_id, first, config)
        return [r[1] for r in gone]


def stored(conn, memory_id: int, key: str) -> Message | None:
    """Message ``key`` as stored (``id`` its position), or None."""
    row = conn.execute(f"SELECT {STORED} FROM tider_messages WHERE memory_id = %s AND key = %s", (memory_id, key))
    row = row.fetchone()
    return None if row is None else _stored_message(row)[3]


def _rewrite_row(conn, memory_id: int, seq: int, new: Message, length: int, vector) -> None:
    """The stored message ``seq`` becomes ``new`` (its vector too, unless ``vector`` is None)."""
    conn.execute(
        "UPDATE tider_messages SET ts = %s, text = %s, speaker = %s, session = %s, channel = %s, topic = %s, "
        "phase = %s, role = %s, stage = %s, metadata = %s, doc_length = %s"
        + (", embedding = %s" if vector is not None else "")
        + " WHERE memory_id = %s AND seq = %s",
        (new.timestamp, new.text, new.speaker, new.session, new.channel, new.topic, new.phase, new.role)
        + (new.stage, Jsonb(dict(new.metadata)), length)
        + ((vector,) if vector is not None else ())
        + (memory_id, seq),
    )


def commit_replace(
    conn,
    memory_name: str,
    memory_id: int,
    new: Message,
    terms: list[str],
    embedded: tuple[np.ndarray, np.ndarray] | None,
    unchanged,
    config: RetrievalConfig,
) -> Message | None:
    """Put ``new`` in place of the stored message with its key, in one transaction, keeping
    that message's ``seq``, if ``unchanged(stored message)`` (it is the one the caller read;
    else nothing is written and this returns None). ``embedded``: ``new``'s vector and its
    chunk vectors (rows), or None to keep the stored ones (the same embedding text).
    Returns the stored message (``id`` its position). Gone meanwhile: ``MessageNotFound``."""
    with conn.transaction():
        dim = _lock(conn, memory_id)
        if embedded is not None and dim is not None and len(embedded[0]) != dim:
            raise StoreError(f"memory {memory_name!r}: a vector of dimension {len(embedded[0])}, it holds {dim}")
        row = conn.execute(
            f"SELECT {STORED} FROM tider_messages WHERE memory_id = %s AND key = %s", (memory_id, new.key)
        ).fetchone()
        if row is None:
            raise MessageNotFound(memory_name, new.key)
        seq, old_pos, old_length, current = _stored_message(row)
        if not unchanged(current):
            return None
        _drop_postings(conn, memory_id, [seq])
        fresh = Fresh([new], np.zeros((1, 0), np.float32), [terms])
        length = fresh.doc_lengths()[0]
        _rewrite_row(conn, memory_id, seq, new, length, None if embedded is None else embedded[0])
        if embedded is not None:
            conn.execute("DELETE FROM tider_chunks WHERE memory_id = %s AND seq = %s", (memory_id, seq))
            chunks = np.asarray(embedded[1], dtype=np.float32)
            if len(chunks):
                fresh.chunk_vectors, fresh.chunk_owners = chunks, np.zeros(len(chunks), dtype=np.int64)
                _insert_chunks(conn, memory_id, fresh, {new.key: (seq, old_pos)})
        new_pos = conn.execute(  # the others before it in (time, seq) order
            "SELECT count(*) FROM tider_messages WHERE memory_id = %s AND (ts, seq) < (%s, %s) AND seq <> %s",
            (memory_id, new.timestamp, seq, seq),
        ).fetchone()[0]
        first = min(int(old_pos), int(new_pos))
        renumber_from(conn, memory_id, first)
        _insert_postings(conn, memory_id, fresh, {new.key: (seq, int(new_pos))})
        conn.execute(
            "UPDATE tider_memories SET total_length = total_length + %s, "
            "max_ts = (SELECT max(ts) FROM tider_messages WHERE memory_id = %s), version = version + 1, "
            "rewritten = version + 1 WHERE id = %s",
            (length - int(old_length), memory_id, memory_id),
        )
        rebuild_timeline(conn, memory_id, first, config)
        return stored(conn, memory_id, new.key)


def _drop_postings(conn, memory_id: int, seqs: list[int]) -> None:
    """Delete the postings of messages ``seqs``; their terms' document frequencies down by
    as many, a term left in no message gone."""
    emptied = conn.execute(
        "WITH gone AS (DELETE FROM tider_postings WHERE memory_id = %(m)s AND seq = ANY(%(seqs)s) RETURNING term), "
        "counted AS (SELECT term, count(*) AS d FROM gone GROUP BY term) "
        "UPDATE tider_terms t SET df = t.df - c.d FROM counted c WHERE t.memory_id = %(m)s AND t.term = c.term "
        "RETURNING t.term, t.df",
        {"m": memory_id, "seqs": seqs},
    ).fetchall()
    zero = [term for term, df in emptied if df <= 0]
    if zero:
        conn.execute("DELETE FROM tider_terms WHERE memory_id = %s AND term = ANY(%s)", (memory_id, zero))


def renumber_from(conn, memory_id: int, first: int) -> None:
    """Positions ``first ..``: the messages stored there (by their old positions), dense,
    in (timestamp, seq) order; then their postings' copies."""
    conn.execute(
        "UPDATE tider_messages m SET pos = r.p FROM (SELECT seq, %s + row_number() OVER (ORDER BY ts, seq) - 1 AS p "
        "FROM tider_messages WHERE memory_id = %s AND pos >= %s) r "
        "WHERE m.memory_id = %s AND m.seq = r.seq AND m.pos <> r.p",
        (first, memory_id, first, memory_id),
    )
    conn.execute(
        "UPDATE tider_postings p SET pos = m.pos FROM tider_messages m WHERE p.memory_id = %s AND m.memory_id = %s "
        "AND m.pos >= %s AND p.seq = m.seq AND p.pos <> m.pos",
        (memory_id, memory_id, first),
    )


def rebuild_timeline(conn, memory_id: int, first_changed: int, config: RetrievalConfig) -> None:
    """Re-merge the timeline from the cluster holding position ``first_changed - 1`` (all
    of it from 0), every vector read from the table."""
    from tider.retrieval.timeline import centroids, cluster_messages

    start = 0
    if first_changed > 0:
        row = conn.execute(
            "SELECT start_pos FROM tider_timeline WHERE memory_id = %s AND start_pos <= %s "
            "ORDER BY start_pos DESC LIMIT 1",
            (memory_id, first_changed - 1),
        ).fetchone()
        start = int(row[0]) if row else 0
    conn.execute("DELETE FROM tider_timeline WHERE memory_id = %s AND start_pos >= %s", (memory_id, start))
    rows = (
        conn.cursor(binary=True)
        .execute(
            "SELECT ts, embedding FROM tider_messages WHERE memory_id = %s AND pos >= %s ORDER BY pos",
            (memory_id, start),
        )
        .fetchall()
    )
    if not rows:
        return
    vectors = np.stack([as_array(r[1]) for r in rows]).astype(np.float32)
    clusters = cluster_messages([r[0] for r in rows], vectors, config.timeline)
    with conn.cursor().copy("COPY tider_timeline (memory_id, start_pos, centroid) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "int8", "vector"])
        for c, centre in zip(clusters, centroids(vectors, clusters)):
            copy.write_row((memory_id, start + c[0], centre))
