"""The lexical channel in SQL: BM25 over the postings, as the embedded store scores it.

Terms are the embedded store's (the memory's ``tider.retrieval.lexical.LexicalAnalysis``
over metadata-expanded text, stems computed in Python at add time and stored as postings,
so both backends index and query the same terms); the formula is bm25s's "lucene" variant with its defaults,
idf = ln(1 + (N - df + 0.5) / (df + 0.5)) and tf / (tf + k1 (1 - b + b dl / avgdl)), over
the statistics of the whole memory (N, df, avgdl), as a search engine with a filter has
them; the filter keeps the query's past. A query term repeated counts repeatedly.

A speaker's name is in most of their messages, and a question naming them would make the
search score every one of those postings. Above ``index_min_messages`` the query's most
frequent term (df over a twentieth of the memory) is set aside, as MaxScore does: the
messages holding any other query term are scored fully (the set-aside term's part looked
up per message); when the list's last score beats the most a message holding only the
set-aside term can score (its weight: tf / (tf + ...) < 1), that is the list; else the
set-aside term's best postings are merged in, read shape by shape off an index (its part
depends on tf and document length alone). Exact either way.

``ts_rank`` (Postgres's own ranking over ``to_tsvector('english', ...)``, built per query,
no index) is here to measure the difference to BM25 (docs/benchmarks.md), not to serve.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

import numpy as np

K1, B = 1.5, 0.75  # bm25s's defaults: the embedded store's BM25
METADATA_COLUMNS = ("speaker", "channel", "phase", "topic", "role")


@dataclass
class LexicalList:
    pos: np.ndarray  # positions, best first (ties: earlier position)
    scores: np.ndarray  # float32, aligned
    complete: bool  # every past message sharing a query term is in the list


@dataclass
class Term:
    term: str
    df: int
    idf: float  # float32, as bm25s stores it
    count: int  # occurrences in the query: each adds its part again, as in bm25s

    @property
    def weight(self) -> float:
        return self.idf * self.count  # the most this term adds to a score (tf / (tf + ...) < 1)


def query_terms(conn, memory_id: int, text: str, n: int, analysis) -> tuple[list[Term], list[str]]:
    """The query's terms that occur in the memory, and its tokens among them in query order."""
    tokens = analysis.terms(text)
    counts = Counter(tokens)
    if not counts or not n:
        return [], []
    rows = conn.execute(
        "SELECT term, df FROM tider_terms WHERE memory_id = %s AND term = ANY(%s)", (memory_id, sorted(counts))
    ).fetchall()
    terms = [
        Term(term, int(df), float(np.float32(math.log(1 + (n - df + 0.5) / (df + 0.5)))), counts[term])
        for term, df in sorted(rows)
    ]
    known = {t.term for t in terms}
    return terms, [t for t in tokens if t in known]


def bm25_list(
    conn,
    memory_id: int,
    text: str,
    n: int,
    total_length: int,
    asked: datetime,
    cut: int,
    depth: int,
    exact_below: int,
    analysis,
) -> LexicalList:
    """The ``depth`` best past messages by BM25. Up to ``exact_below`` messages every
    posting of the query's terms is scored, parts summed in float32 in query order as
    bm25s does (same scores, same ties); above, sums are in double precision rounded once
    (a score may differ from bm25s's in the last float32 bit), and the query's most
    frequent term is set aside (module docstring)."""
    terms, order = query_terms(conn, memory_id, text, n, analysis)
    if not terms:
        return LexicalList(np.zeros(0, np.int64), np.zeros(0, np.float32), True)
    by_term = {t.term: t for t in terms}
    first = list(dict.fromkeys(order))  # distinct terms, in query order
    params = {"m": memory_id, "asked": asked, "depth": depth, "k1": K1, "one_b": 1 - B, "b": B}
    params.update(avgdl=total_length / n, terms=first, weights=[by_term[t].weight for t in first], essential=first)
    if n <= exact_below:
        rows = conn.execute(ORDERED_SQL, params).fetchall()
        return _listed(rows, not rows or rows[0][2] <= depth)
    low = min(terms, key=lambda t: (t.weight, t.term))
    aside = low if len(terms) > 1 and low.df >= max(2 * depth, n // 20) else None
    if aside is None:
        rows = conn.execute(summed_sql(False), params).fetchall()
        return _listed(rows, not rows or rows[0][2] <= depth)
    params.update(essential=[t for t in first if t != aside.term], aside=aside.term, aside_w=aside.weight)
    rows = conn.execute(summed_sql(True), params).fetchall()
    hits = rows[0][2] if rows else 0
    if hits >= depth and rows[depth - 1][1] > aside.weight:  # a message holding only that term scores less
        return _listed(rows, False)
    taken = {r[0] for r in rows}
    fill, every = _fill(conn, params, aside, depth, taken, cut)
    merged = sorted(rows + fill, key=lambda r: (-r[1], r[0]))
    return _listed(merged[:depth], every and len(rows) == hits and len(merged) <= depth)


def _fill(conn, params: dict, aside: Term, want: int, taken: set, cut: int) -> tuple[list, bool]:
    """The best ``want`` past messages holding the set-aside term and none of the others
    (not in ``taken``): the term's part depends on (tf, document length) alone, so its
    postings come in a few shapes; score each shape here (the SQL's arithmetic, in the
    same order), then read the shapes best first, each in position order, off the
    ``(memory_id, term, tf, doc_length, pos)`` index. Also whether all were read."""
    shapes = conn.execute(SHAPES_SQL, params).fetchall()
    score_of = {}
    for tf, dl in shapes:
        tfc = tf / (tf + K1 * ((1 - B) + B * dl / params["avgdl"]))
        score_of[(tf, dl)] = float(np.float32(aside.weight * tfc))
    out: list = []
    for score in sorted(set(score_of.values()), reverse=True):
        group = [s for s, v in score_of.items() if v == score]
        limit = want + len(taken) - len(out)
        found = sorted(  # per shape an index range in position order; equal scores merge by position
            p
            for tf, dl in group
            for (p,) in conn.execute(
                "SELECT pos FROM tider_postings WHERE memory_id = %s AND term = %s AND tf = %s AND doc_length = %s "
                "AND pos < %s ORDER BY pos LIMIT %s",
                (params["m"], aside.term, tf, dl, cut, limit),
            )
        )[:limit]
        out += [(p, score, 0) for p in found if p not in taken]
        if len(found) == limit and len(out) >= want:
            return out, False
    return out, True


def _listed(rows, complete: bool) -> LexicalList:
    pos = np.array([r[0] for r in rows], dtype=np.int64)
    return LexicalList(pos, np.array([r[1] for r in rows], dtype=np.float32), complete)


# One posting's part, idf * tf / (tf + k1 (1 - b + b dl / avgdl)), in bm25s's order of
# operations (float64), rounded to float32 as bm25s stores it; the weight is the term's
# idf times its count in the query.
TFC = "(p.tf / (p.tf + %(k1)s * (%(one_b)s + %(b)s * p.doc_length / %(avgdl)s)))"
PART = f"((%(weights)s::float8[])[array_position(%(terms)s::text[], p.term)] * {TFC})::real"
ASIDE_PART = f"(%(aside_w)s * {TFC})::real"
HITS = "p.memory_id = %(m)s AND p.term = ANY(%(essential)s) AND p.ts <= %(asked)s"
TAIL = "SELECT pos, score, (SELECT count(*) FROM h) FROM top ORDER BY score DESC, pos"
# Parts summed in float32 in query order, as bm25s does: the same scores and ties.
ORDERED_SQL = f"""WITH h AS (
        SELECT p.pos, tider_sum_float4({PART} ORDER BY array_position(%(terms)s::text[], p.term)) AS score
        FROM tider_postings p WHERE {HITS} GROUP BY p.pos),
    top AS (SELECT * FROM h ORDER BY score DESC, pos LIMIT %(depth)s)
    {TAIL}"""
# The (tf, document length) shapes of a term's postings: one index probe per shape.
SHAPES_SQL = """WITH RECURSIVE s AS (
        (SELECT tf, doc_length FROM tider_postings WHERE memory_id = %(m)s AND term = %(aside)s
         ORDER BY tf, doc_length LIMIT 1)
        UNION ALL
        SELECT x.tf, x.doc_length FROM s, LATERAL (
            SELECT tf, doc_length FROM tider_postings WHERE memory_id = %(m)s AND term = %(aside)s
            AND (tf, doc_length) > (s.tf, s.doc_length) ORDER BY tf, doc_length LIMIT 1) x)
    SELECT tf, doc_length FROM s"""


def summed_sql(aside: bool) -> str:
    """Messages holding an essential term, scored in double precision; with ``aside``, the
    set-aside term's part looked up per message."""
    extra = "0"
    if aside:
        extra = (
            f"coalesce((SELECT {ASIDE_PART} FROM tider_postings p WHERE p.memory_id = %(m)s "
            "AND p.term = %(aside)s AND p.seq = h.seq), 0)"
        )
    return f"""WITH h AS (SELECT p.seq, p.pos, sum({PART}::float8) AS s FROM tider_postings p WHERE {HITS}
                   GROUP BY p.seq, p.pos),
    top AS (SELECT h.pos, (h.s + {extra})::real AS score FROM h ORDER BY score DESC, h.pos LIMIT %(depth)s)
    {TAIL}"""


def ts_rank_list(conn, memory_id: int, text: str, fields, asked: datetime, depth: int) -> LexicalList:
    """Postgres's ``ts_rank`` over the metadata-expanded text (English stemming and stop
    words), OR of the query's terms: the comparison the issue asks for, exact and slow."""
    from tider.retrieval.bm25 import tokenize

    words = sorted(set(tokenize(text)))
    columns = ", ".join(f for f in fields if f in METADATA_COLUMNS)
    if not words:
        return LexicalList(np.zeros(0, np.int64), np.zeros(0, np.float32), True)
    doc = f"to_tsvector('english', concat_ws(' ', text{', ' + columns if columns else ''}))"
    rows = conn.execute(
        f"""WITH q AS (SELECT to_tsquery('english', %(query)s) AS q),
        r AS (SELECT pos, ts, seq, ts_rank({doc}, q.q) AS score FROM tider_messages, q
              WHERE memory_id = %(m)s AND ts <= %(asked)s AND {doc} @@ q.q)
        SELECT pos, score, count(*) OVER () FROM r ORDER BY score DESC, ts, seq LIMIT %(depth)s""",
        {"query": " | ".join(words), "m": memory_id, "asked": asked, "depth": depth},
    ).fetchall()
    pos = np.array([r[0] for r in rows], dtype=np.int64)
    hits = int(rows[0][2]) if rows else 0
    return LexicalList(pos, np.array([r[1] for r in rows], dtype=np.float32), hits <= depth)
