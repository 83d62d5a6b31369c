"""The channels as SQL, and the fusion over what they return.

Per query, in one read-only snapshot:

- ``cut``: the stored bound of what the query may see (past the last message at or before
  ``asked_at``, found on the ``(memory_id, ts, seq)`` index);
- the dense list: pgvector's inner product on unit vectors (= cosine), best first among
  the past: an exact scan of the memory's rows, ``rrf_depth`` deep, or, from
  ``hnsw_min_messages`` visible messages on and with its index built, the memory's HNSW
  index, about ``PostgresConfig.hnsw_depth`` deep; merged with the same depth of past
  messages ranked by their best chunk (``tider_chunks``, scanned exactly), each message
  keeping its best score (``tider.memory.index.best_per_message``);
- the lexical list: BM25 in SQL (``tider.memory.pg.lexical``), ``rrf_depth`` deep; when
  fewer messages match, it goes on with the earliest non-matching past positions at score
  0, as the embedded store's rank of a score vector does;
- window ranges: each window's first and last position, two index probes per window.

The SQL speaks stored positions, which a delete leaves sparse; every list is turned into
the dense positions the fusion and the API use (``tider.memory.pg.gaps``) before it fuses.

On the HNSW path the lexical list runs on a second connection that shares the snapshot
(``pg_export_snapshot``), at the same time as the dense walk: the two are the search's
cost, and a server process each makes the search about as long as the longer one.

Python then fuses, with the embedded store's own functions (``tider.memory.index``:
``fuse_lists``, ``semantic_top_k``, ``windowed_rank``), so equal lists give equal floats.
"""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from tider.memory import index as indexed
from tider.memory.pg.config import PostgresConfig
from tider.memory.pg.gaps import NO_GAPS
from tider.memory.pg.lexical import bm25_list, ts_rank_list
from tider.retrieval.config import RetrievalConfig
from tider.scoring import merge_intervals
from tider.types import Message, Window

FAR_FUTURE = datetime(9999, 12, 31)


@dataclass(frozen=True)
class MemoryRow:
    """What a snapshot says about one memory."""

    id: int
    n: int
    total_length: int
    version: int
    dim: int | None
    max_ts: datetime | None
    rewritten: int = 0  # the version of the last delete or update
    gaps: int = 0  # stored positions no message holds

    @property
    def span(self) -> int:
        """The stored positions in use (0 .. span-1), gaps included."""
        return self.n + self.gaps

    @classmethod
    def read(cls, conn, name: str) -> MemoryRow | None:
        row = conn.execute(
            "SELECT id, n_messages, total_length, version, dim, max_ts, rewritten, gaps FROM tider_memories "
            "WHERE name = %s",
            (name,),
        ).fetchone()
        return cls(*row) if row else None


def cut_at(conn, row: MemoryRow, asked: datetime) -> int:
    """The stored bound of the messages at or before ``asked`` (exclusive)."""
    if row.max_ts is not None and asked >= row.max_ts:
        return row.span
    found = conn.execute(
        "SELECT pos FROM tider_messages WHERE memory_id = %s AND ts <= %s ORDER BY ts DESC, seq DESC LIMIT 1",
        (row.id, asked),
    ).fetchone()
    return int(found[0]) + 1 if found else 0


def dense_sql(row: MemoryRow, hnsw: bool) -> str:
    """The dense channel's statement: parameters ``q``, ``asked``, ``depth``, ``m``. The
    HNSW form names the memory's partial expression index exactly (its id and the vector
    dimension as literals), so the planner can use it. The index holds half-precision
    vectors: half the size, and its walk about a tenth faster at 100k messages
    (docs/benchmarks.md); the walk's candidates are scored on the stored float32 vectors."""
    if not hnsw:
        return (
            "SELECT pos, (embedding <#> %(q)s) AS d FROM tider_messages WHERE memory_id = %(m)s "
            "AND ts <= %(asked)s ORDER BY d, pos LIMIT %(depth)s"
        )
    dim = int(row.dim)
    half = f"::halfvec({dim})"
    return (
        f"SELECT pos, (embedding::vector({dim}) <#> %(q)s::vector({dim})) FROM tider_messages "
        f"WHERE memory_id = {int(row.id)} AND ts <= %(asked)s "
        f"ORDER BY embedding{half} <#> %(q)s{half} LIMIT %(depth)s"
    )


# The past messages by their best chunk: the chunks are a minority (long messages' extra
# windows), scanned exactly; no graph over them yet.
CHUNK_SQL = (
    "SELECT m.pos, min(c.embedding <#> %(q)s) AS d FROM tider_chunks c JOIN tider_messages m "
    "ON m.memory_id = c.memory_id AND m.seq = c.seq WHERE c.memory_id = %(m)s AND m.ts <= %(asked)s "
    "GROUP BY m.pos ORDER BY d, m.pos LIMIT %(depth)s"
)


def dense_list(conn, row: MemoryRow, vector: np.ndarray, asked: datetime, depth: int, hnsw: bool, past: int = 0):
    """``(stored positions, cosines)`` of the ``depth`` best past messages (exact, or the
    HNSW walk), a message's cosine being its best chunk's. The walk gathers ``depth``
    candidates scaled by the share (``past`` of ``row.n``) the query may see, so the past filter leaves about
    ``depth`` (a second walk, pgvector's iterative scan, would cost as much again); the
    list is re-sorted by score anyway."""
    params = {"q": np.ascontiguousarray(vector, dtype=np.float32), "m": row.id, "asked": asked, "depth": depth}
    with conn.pipeline():  # one round trip for every statement
        if hnsw:
            ef = min(1000, int(np.ceil(depth * row.n / max(past, 1))))
            # enable_sort off: the graph's own order, never a scan and sort
            conn.execute(
                "SELECT set_config('hnsw.ef_search', %s, true), set_config('enable_sort', 'off', true)", (str(ef),)
            )
            walk = conn.execute(dense_sql(row, True), params)
            conn.execute("SET LOCAL enable_sort = on")
        else:
            walk = conn.execute(dense_sql(row, False), params)
        chunked = conn.execute(CHUNK_SQL, params)
    rows, chunk_rows = walk.fetchall(), chunked.fetchall()
    pos = np.array([r[0] for r in rows + chunk_rows], dtype=np.int64)
    scores = -np.array([r[1] for r in rows + chunk_rows], dtype=np.float32)  # <#> is the negative inner product
    return indexed.best_per_message(pos, scores) if chunk_rows else (pos, scores)


def lexical_top(conn, row: MemoryRow, text: str, asked: datetime, cut: int, config: RetrievalConfig, pg):
    """The lexical list (stored positions, best first; ``cut`` the stored bound of the past)."""
    if pg.lexical == "ts_rank":
        return ts_rank_list(conn, row.id, text, config.metadata_fields, asked, config.rrf_depth)
    return bm25_list(
        conn,
        row.id,
        text,
        row.n,
        row.total_length,
        asked,
        cut,
        config.rrf_depth,
        config.index_min_messages,
        config.lexical(),
    )


def filled(found, past: int, depth: int):
    """``(positions, scores)`` of a lexical list in dense positions as the embedded store
    ranks it: when it is complete and short, the earliest past messages sharing no term
    follow at 0; ``(None, None)`` when no past message shares a term with the query."""
    if not len(found.pos):
        return None, None
    pos, scores = found.pos, found.scores
    want = min(depth, past)
    if found.complete and len(pos) < want:
        fill = indexed._fillers([(0, past)], np.sort(pos), want - len(pos))[0]
        pos, scores = np.concatenate([pos, fill]), np.concatenate([scores, np.zeros(len(fill), np.float32)])
    return pos, scores


def candidates(conn, row, text, vector, mode, cut, asked, hnsw, config: RetrievalConfig, pg: PostgresConfig, **how):
    """The query's window-independent part: ``tider.memory.index.Candidates``, in dense
    positions (``how["gaps"]`` translates; ``cut`` is the stored bound of the past). With
    ``how["side"]`` (``side(fn, *args)`` runs ``fn`` on a second connection in the same
    snapshot), the lexical list runs there meanwhile."""
    gaps, side = how.get("gaps", NO_GAPS), how.get("side")
    past = gaps.dense(cut)
    dense_pos = dense_scores = bm25_pos = bm25_scores = None
    lexical = None
    if mode == "hybrid" and side is not None:
        lexical = _CHANNELS.submit(side, lexical_top, row, text, asked, cut, config, pg)
    try:
        if mode in ("dense", "hybrid"):
            depth = min(config.index_depth, config.rrf_depth, pg.hnsw_depth) if hnsw else config.rrf_depth
            dense_pos, dense_scores = dense_list(conn, row, vector, asked, depth, hnsw, past)
            dense_pos = gaps.dense(dense_pos)
    finally:
        if lexical is not None:
            futures.wait([lexical])  # the side connection is in use until its transaction ends
    if mode in ("bm25", "hybrid"):
        found = lexical.result() if lexical is not None else lexical_top(conn, row, text, asked, cut, config, pg)
        bm25_pos, bm25_scores = filled(replace(found, pos=gaps.dense(found.pos)), past, config.rrf_depth)
    return indexed.fuse_lists(dense_pos, dense_scores, bm25_pos, bm25_scores, mode, config, past)


# The lexical lists that run beside a dense walk (one per concurrent search).
_CHANNELS = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="tider-pg-lexical")


def window_ranges(conn, row: MemoryRow, windows: tuple[Window, ...], cut: int, gaps=NO_GAPS) -> list[tuple[int, int]]:
    """Half-open dense position ranges of the windows within the past (``cut`` its stored
    bound), merged (``channels.id_ranges``)."""
    rows = conn.execute(
        """SELECT
             coalesce((SELECT pos FROM tider_messages WHERE memory_id = %(m)s AND ts >= w.s ORDER BY ts, seq LIMIT 1),
                      %(n)s),
             coalesce((SELECT pos FROM tider_messages WHERE memory_id = %(m)s AND ts > w.e ORDER BY ts, seq LIMIT 1),
                      %(n)s)
           FROM unnest(%(starts)s::timestamp[], %(ends)s::timestamp[]) AS w(s, e)""",
        {"m": row.id, "n": row.span, "starts": [w.start for w in windows], "ends": [w.end for w in windows]},
    ).fetchall()
    dense = ((gaps.dense(min(lo, cut)), gaps.dense(min(hi, cut))) for lo, hi in rows)
    return merge_intervals((int(lo), int(hi)) for lo, hi in dense if hi > lo)


def messages_at(conn, row: MemoryRow, positions, gaps=NO_GAPS) -> list[Message]:
    """The messages at dense ``positions`` (``Message.id`` = that position), in that order."""
    from tider.memory.pg.views import ROW_COLUMNS, message_of

    wanted = [int(p) for p in positions]
    stored = [int(p) for p in np.atleast_1d(gaps.stored(np.asarray(wanted, dtype=np.int64)))]
    rows = conn.execute(
        f"SELECT pos, {ROW_COLUMNS} FROM tider_messages WHERE memory_id = %s AND pos = ANY(%s)", (row.id, stored)
    ).fetchall()
    by_pos = {r[0]: message_of(r[1:]) for r in rows}
    return [replace(by_pos[s], id=p) for p, s in zip(wanted, stored)]
