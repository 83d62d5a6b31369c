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
2. a delete leaves its stored positions as gaps (``tider_gaps``, ``tider.memory.pg.gaps``):
   no later row moves; once the gaps outnumber the messages, ``compact`` closes them all.
   An update that moves in time reorders the stored positions between its old and new
   places (none when its time keeps its place); the postings' copies of the moved follow;
3. the timeline re-merges from the cluster holding the position before the first changed
   one (the greedy merge is left to right and restarts at every cluster it opens, so the
   clusters before are what a memory built from the survivors has), up to where it opens
   a cluster an old one opened past the change (after an update that moved nothing);
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

Cost: a delete writes the rows it deletes, their postings and gaps, and re-merges the
timeline from the cluster before it until it realigns: about the same for the oldest
message as for the newest. An update whose time keeps its place rewrites its own rows; one
that moves rewrites the rows (and their postings) between its two places. Measured:
``bench/bench_backends.py --changes`` (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
from psycopg.types.json import Jsonb

from tider.memory.files import StoreError
from tider.memory.pg.write import Fresh, _insert_chunks, _insert_postings, as_array, bm25_terms, write_clusters
from tider.memory.records import MessageNotFound
from tider.retrieval.config import RetrievalConfig
from tider.types import Message

STORED = "seq, pos, key, ts, text, speaker, session, channel, topic, phase, stage, role, metadata, doc_length"
MOVED = ", ".join(f"m.{c}" for c in STORED.split(", "))
REANALYSE_UNDER = 2000  # moved messages whose postings are found by (term, seq); more: one scan
FEW = 64  # deleted messages whose postings are found by (term, seq); more: a join on seq


def _stored_message(row, dense: int | None = None) -> tuple[int, int, int, Message]:
    """``(seq, pos, doc_length, message)`` of a ``STORED`` row; the message's ``id`` is
    ``dense`` (its position as the API reports it), or its stored position."""
    seq, pos, key, ts, text, speaker, session, channel, topic, phase, stage, role, metadata, length = row
    meta = tuple(sorted(metadata.items()))
    at = pos if dense is None else dense
    return seq, pos, length, Message(at, key, text, ts, speaker, session, channel, topic, phase, stage, role, meta)


def read_message(conn, memory_id: int, key: str) -> Message | None:
    """The stored message ``key`` (``id`` its position: the stored one less the gaps below
    it), one row and an index count of the gaps read."""
    found = conn.execute(
        f"SELECT {STORED}, (SELECT count(*) FROM tider_gaps g WHERE g.memory_id = m.memory_id AND g.pos < m.pos) "
        "FROM tider_messages m WHERE memory_id = %s AND key = %s",
        (memory_id, key),
    ).fetchone()
    return None if found is None else _stored_message(found[:-1], int(found[1]) - int(found[-1]))[3]


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
        rows = conn.execute(f"DELETE FROM tider_messages WHERE {' AND '.join(where)} RETURNING {STORED}", params)
        gone = sorted((_stored_message(r) for r in rows.fetchall()), key=lambda g: g[1])  # time order
        if not gone:
            return []
        seqs, messages = [g[0] for g in gone], [g[3] for g in gone]
        _drop_postings(conn, memory_id, seqs, bm25_terms(messages, config))
        n, gaps = conn.execute(
            "UPDATE tider_memories SET n_messages = n_messages - %s, total_length = total_length - %s, "
            "gaps = gaps + %s, max_ts = (SELECT max(ts) FROM tider_messages WHERE memory_id = %s), "
            "version = version + 1, rewritten = version + 1 WHERE id = %s RETURNING n_messages, gaps",
            (len(gone), sum(int(g[2]) for g in gone), len(gone), memory_id, memory_id),
        ).fetchone()
        if gaps > n:  # more holes than messages: close them all (amortized over the deletes that made them)
            compact(conn, memory_id, config)
        else:
            conn.execute(
                "INSERT INTO tider_gaps (memory_id, pos) SELECT %s, unnest(%s::bigint[])",
                (memory_id, [int(g[1]) for g in gone]),
            )
            rebuild_timeline(conn, memory_id, int(gone[0][1]), config, unchanged_from=int(gone[-1][1]) + 1)
        return [m.key for m in messages]


def compact(conn, memory_id: int, config: RetrievalConfig) -> None:
    """Close every gap: positions dense from 0 again (the postings follow), the timeline
    re-merged whole. Costs about as much as the memory; a delete runs it once the gaps
    outnumber the messages."""
    renumber(conn, memory_id, 0, config)
    conn.execute("DELETE FROM tider_gaps WHERE memory_id = %s", (memory_id,))
    conn.execute("UPDATE tider_memories SET gaps = 0 WHERE id = %s", (memory_id,))
    rebuild_timeline(conn, memory_id, 0, config)


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
        _drop_postings(conn, memory_id, [seq], bm25_terms([current], config))
        fresh = Fresh([new], np.zeros((1, 0), np.float32), [terms])
        length = fresh.doc_lengths()[0]
        _rewrite_row(conn, memory_id, seq, new, length, None if embedded is None else embedded[0])
        if embedded is not None:
            conn.execute("DELETE FROM tider_chunks WHERE memory_id = %s AND seq = %s", (memory_id, seq))
            chunks = np.asarray(embedded[1], dtype=np.float32)
            if len(chunks):
                fresh.chunk_vectors, fresh.chunk_owners = chunks, np.zeros(len(chunks), dtype=np.int64)
                _insert_chunks(conn, memory_id, fresh, {new.key: (seq, old_pos)})
        first, last = _moved_range(conn, memory_id, seq, int(old_pos), new.timestamp)
        if first != last:  # it moved: the positions between follow; the others stay
            renumber(conn, memory_id, first, config, last)
        new_pos = conn.execute(
            "SELECT pos FROM tider_messages WHERE memory_id = %s AND seq = %s", (memory_id, seq)
        ).fetchone()[0]
        _insert_postings(conn, memory_id, fresh, {new.key: (seq, int(new_pos))})
        conn.execute(
            "UPDATE tider_memories SET total_length = total_length + %s, "
            "max_ts = (SELECT max(ts) FROM tider_messages WHERE memory_id = %s), version = version + 1, "
            "rewritten = version + 1 WHERE id = %s",
            (length - int(old_length), memory_id, memory_id),
        )
        rebuild_timeline(conn, memory_id, first, config, unchanged_from=last + 1)
        return read_message(conn, memory_id, new.key)


def _moved_range(conn, memory_id: int, seq: int, old_pos: int, ts: datetime) -> tuple[int, int]:
    """The stored positions an update of message ``seq`` (at ``old_pos``) to time ``ts``
    reorders: from its old place to the last other message before its new one, or from the
    first other after its new one to its old place; ``(old_pos, old_pos)`` when it keeps
    its place. Two index probes on ``(memory_id, ts, seq)``."""
    probe = (
        "SELECT pos FROM tider_messages WHERE memory_id = %s AND (ts, seq) {} (%s, %s) AND seq <> %s "
        "ORDER BY ts {}, seq {} LIMIT 1"
    )
    before = conn.execute(probe.format("<", "DESC", "DESC"), (memory_id, ts, seq, seq)).fetchone()
    if before is not None and before[0] > old_pos:
        return old_pos, int(before[0])
    after = conn.execute(probe.format(">", "", ""), (memory_id, ts, seq, seq)).fetchone()
    if after is not None and after[0] < old_pos:
        return int(after[0]), old_pos
    return old_pos, old_pos


def _drop_postings(conn, memory_id: int, seqs: list[int], terms: list[list[str]]) -> None:
    """Delete the postings of messages ``seqs`` (whose BM25 terms are ``terms``); their
    terms' document frequencies down by as many, a term left in no message gone. Found by
    (term, seq), the postings' key; a scan of the memory's postings only if some were
    missed (terms analysed differently when they were written)."""
    params = {"m": memory_id, "seqs": seqs, "terms": sorted({t for ts in terms for t in ts})}
    emptied: dict[str, tuple[int, int]] = {}
    if len(seqs) <= FEW:
        keyed = "DELETE FROM tider_postings WHERE memory_id = %(m)s AND term = ANY(%(terms)s) AND seq = ANY(%(seqs)s)"
        emptied = _count_down(conn, keyed, params)
    if sum(d for _, d in emptied.values()) != sum(len(set(ts)) for ts in terms):  # many, or some missed
        scan = (
            "DELETE FROM tider_postings p USING unnest(%(seqs)s::bigint[]) AS g(seq) "
            "WHERE p.memory_id = %(m)s AND p.seq = g.seq"
        )
        emptied.update(_count_down(conn, scan, params))
    zero = [term for term, (df, _) in emptied.items() if df <= 0]
    if zero:
        conn.execute("DELETE FROM tider_terms WHERE memory_id = %s AND term = ANY(%s)", (memory_id, zero))


def _count_down(conn, delete: str, params: dict) -> dict[str, tuple[int, int]]:
    """Run ``delete`` (postings, returning their terms); each term's df down by its count:
    ``{term: (df now, postings deleted)}``."""
    rows = conn.execute(
        f"WITH gone AS ({delete} RETURNING term), counted AS (SELECT term, count(*) AS d FROM gone GROUP BY term) "
        "UPDATE tider_terms t SET df = t.df - c.d FROM counted c WHERE t.memory_id = %(m)s AND t.term = c.term "
        "RETURNING t.term, t.df, c.d",
        params,
    ).fetchall()
    return {term: (int(df), int(d)) for term, df, d in rows}


def renumber(conn, memory_id: int, first: int, config: RetrievalConfig, last: int | None = None) -> None:
    """The messages stored at positions ``first .. last`` back in (timestamp, seq) order: a
    range keeps its set of stored positions (its gaps stay); to the end (``last`` None) the
    positions become dense from ``first`` (the caller drops the gaps there). Then the
    postings' copies of the positions that moved, found by (term, seq) (their terms
    analysed again) when few moved, else by a scan."""
    upto, params = ("", ()) if last is None else (" AND pos <= %s", (last,))
    if last is None:
        target = (
            "SELECT seq, %s + row_number() OVER (ORDER BY ts, seq) - 1 AS p "
            "FROM tider_messages WHERE memory_id = %s AND pos >= %s"
        )
        args = (first, memory_id, first)
    else:
        ranked = (
            "SELECT {}, row_number() OVER (ORDER BY {}) AS r FROM tider_messages WHERE memory_id = %s AND pos >= %s"
        )
        target = (
            f"SELECT o.seq, s.pos AS p FROM ({ranked.format('seq', 'ts, seq')}{upto}) o "
            f"JOIN ({ranked.format('pos', 'pos')}{upto}) s USING (r)"
        )
        args = (memory_id, first, last, memory_id, first, last)
    moved = conn.execute(
        f"UPDATE tider_messages m SET pos = r.p FROM ({target}) r "
        f"WHERE m.memory_id = %s AND m.seq = r.seq AND m.pos <> r.p RETURNING {MOVED}",
        (*args, memory_id),
    ).fetchall()
    if not moved:
        return
    if len(moved) <= REANALYSE_UNDER:
        messages = [_stored_message(r) for r in moved]
        terms = bm25_terms([m[3] for m in messages], config)
        rows = [(t, seq, pos) for (seq, pos, _, _), ts in zip(messages, terms) for t in sorted(set(ts))]
        if rows:
            done = conn.execute(
                "UPDATE tider_postings p SET pos = u.pos FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) "
                "AS u(term, seq, pos) WHERE p.memory_id = %s AND p.term = u.term AND p.seq = u.seq",
                ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], memory_id),
            ).rowcount
            if done == len(rows):
                return
    conn.execute(  # the range's messages joined to the memory's postings by seq
        "UPDATE tider_postings p SET pos = m.pos FROM tider_messages m WHERE p.memory_id = %s AND m.memory_id = %s "
        f"AND m.pos >= %s{upto.replace('pos', 'm.pos')} AND p.seq = m.seq AND p.pos <> m.pos",
        (memory_id, memory_id, first, *params),
    )


def rebuild_timeline(
    conn, memory_id: int, first_changed: int, config: RetrievalConfig, unchanged_from: int | None = None
) -> None:
    """Re-merge the timeline from the cluster holding stored position ``first_changed - 1``
    (all of it from 0), every vector read from the table. ``unchanged_from``: the messages
    from that stored position on are unchanged. The greedy merge starts afresh at each
    cluster it opens, so once it opens one where an old cluster started (past the change)
    the rest is the old timeline: it stops there."""
    from tider.retrieval.timeline import centroids, cluster_messages

    start = 0
    if first_changed > 0:
        row = conn.execute(
            "SELECT start_pos FROM tider_timeline WHERE memory_id = %s AND start_pos <= %s "
            "ORDER BY start_pos DESC LIMIT 1",
            (memory_id, first_changed - 1),
        ).fetchone()
        start = int(row[0]) if row else 0
    old_starts = _old_starts(conn, memory_id, unchanged_from)
    stop = max(old_starts) if len(old_starts) == REALIGN_WITHIN else None  # read no further
    upto = "" if stop is None else f" AND pos < {int(stop)}"
    rows = (
        conn.cursor(binary=True)
        .execute(
            f"SELECT pos, ts, embedding FROM tider_messages WHERE memory_id = %s AND pos >= %s{upto} ORDER BY pos",
            (memory_id, start),
        )
        .fetchall()
    )
    vectors = np.stack([as_array(r[2]) for r in rows]).astype(np.float32) if rows else None
    clusters = cluster_messages([r[1] for r in rows], vectors, config.timeline) if rows else []
    starts = [int(rows[c[0]][0]) for c in clusters]
    realigned = next((j for j, p in enumerate(starts) if p in old_starts), None)
    if realigned is None and stop is not None:  # no realignment in reach: all of it
        return rebuild_timeline(conn, memory_id, first_changed, config)
    if realigned is None:
        conn.execute("DELETE FROM tider_timeline WHERE memory_id = %s AND start_pos >= %s", (memory_id, start))
    else:
        conn.execute(  # the old clusters after the realignment stay
            "DELETE FROM tider_timeline WHERE memory_id = %s AND start_pos >= %s AND start_pos < %s",
            (memory_id, start, starts[realigned]),
        )
        clusters, starts = clusters[:realigned], starts[:realigned]
    if clusters:
        write_clusters(conn, memory_id, starts, centroids(vectors, clusters))


REALIGN_WITHIN = 8  # old clusters past a change within which the re-merge looks for its realignment


def _old_starts(conn, memory_id: int, unchanged_from: int | None) -> set[int]:
    """The first ``REALIGN_WITHIN`` old cluster starts past the change."""
    if unchanged_from is None:
        return set()
    rows = conn.execute(
        "SELECT start_pos FROM tider_timeline WHERE memory_id = %s AND start_pos >= %s ORDER BY start_pos LIMIT %s",
        (memory_id, unchanged_from, REALIGN_WITHIN),
    ).fetchall()
    return {int(r[0]) for r in rows}
