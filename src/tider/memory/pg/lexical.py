"""The lexical channel in SQL: BM25 over the postings, as the embedded store scores it.

Terms are the embedded store's (``tider.retrieval.bm25.tokenize`` over metadata-expanded
text, computed at add time); the formula is bm25s's "lucene" variant with its defaults,
idf = ln(1 + (N - df + 0.5) / (df + 0.5)) and tf / (tf + k1 (1 - b + b dl / avgdl)), over
the statistics of the whole memory (N, df, avgdl), as a search engine with a filter has
them; the filter keeps the query's past. A query term repeated counts repeatedly.

Ranking every message that shares a frequent term (a speaker's name is in most of their
messages) would make a search cost a scan of most postings. So the top list is found as
MaxScore does: the frequent terms are set aside, the messages holding any other query
term are scored fully (the set-aside terms' contributions looked up per message), and
the list stands when the depth-th score beats the most a message holding only set-aside
terms could score (the sum of their weights: tf / (tf + ...) < 1); else one more term
joins and the query reruns, down to scoring every posting. The list is exact either way.

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


def query_terms(conn, memory_id: int, text: str, n: int) -> tuple[list[Term], list[str]]:
    """The query's terms that occur in the memory, and its tokens among them in query order."""
    from tider.retrieval.bm25 import tokenize

    tokens = tokenize(text)
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


def bm25_list(conn, memory_id: int, text: str, n: int, total_length: int, asked: datetime, depth: int) -> LexicalList:
    terms, order = query_terms(conn, memory_id, text, n)
    terms.sort(key=lambda t: (t.weight, t.term))
    if not terms:
        return LexicalList(np.zeros(0, np.int64), np.zeros(0, np.float32), True)
    idf = {t.term: t.idf for t in terms}
    params = {"m": memory_id, "asked": asked, "depth": depth, "k1": K1, "one_b": 1 - B, "b": B}
    params.update(avgdl=total_length / n, order=order, idf=[idf[t] for t in order])
    frequent = max(4 * depth, n // 20)  # set aside only terms this common: the rest is cheap to score
    aside = 0
    while aside < len(terms) - 1 and terms[aside].df >= frequent and sum(t.df for t in terms[aside + 1 :]) >= depth:
        aside += 1
    while True:
        params.update(essential=[t.term for t in terms[aside:]], aside=[t.term for t in terms[:aside]])
        rows = conn.execute(_aside_sql() if aside else EXACT_SQL, params).fetchall()
        hits = int(rows[0][2]) if rows else 0
        bound = sum(t.weight for t in terms[:aside])
        if not aside or (hits >= depth and rows[depth - 1][1] > bound):
            pos = np.array([r[0] for r in rows], dtype=np.int64)
            return LexicalList(pos, np.array([r[1] for r in rows], dtype=np.float32), hits <= depth and not aside)
        aside -= 1  # the set-aside terms could still place a message: score one more fully


# One posting's part, idf * tf / (tf + k1 (1 - b + b dl / avgdl)), in bm25s's order of
# operations (float64), rounded to float32 as bm25s stores it.
PART = "(q.w * (p.tf / (p.tf + %(k1)s * (%(one_b)s + %(b)s * p.doc_length / %(avgdl)s))))::real"
QUERY = "q AS (SELECT * FROM unnest(%(order)s::text[], %(idf)s::float8[]) WITH ORDINALITY AS q(term, w, ord))"
TAIL = """SELECT m.pos, top.score, (SELECT count(*) FROM h) FROM top
    JOIN tider_messages m ON m.memory_id = %(m)s AND m.seq = top.seq ORDER BY top.score DESC, top.ts, top.seq"""
# Every posting of the query's terms: parts summed in float32 in query order, as bm25s
# does, so the scores (and their ties, broken by position) are bm25s's.
EXACT_SQL = f"""WITH {QUERY},
    h AS (SELECT p.seq, p.ts, tider_sum_float4({PART} ORDER BY q.ord) AS score
          FROM tider_postings p JOIN q ON q.term = p.term
          WHERE p.memory_id = %(m)s AND p.term = ANY(%(essential)s) AND p.ts <= %(asked)s GROUP BY p.seq, p.ts),
    top AS (SELECT * FROM h ORDER BY score DESC, ts, seq LIMIT %(depth)s)
    {TAIL}"""


def _aside_sql() -> str:
    """Messages holding an essential term, their set-aside terms' parts looked up per
    message (summed in double precision, then rounded: at scale a score may differ from
    bm25s's in the last float32 bit)."""
    extra = (
        f"(SELECT sum({PART}) FROM tider_postings p JOIN q ON q.term = p.term "
        "WHERE p.memory_id = %(m)s AND p.term = ANY(%(aside)s) AND p.seq = h.seq)"
    )
    return f"""WITH {QUERY},
    h AS (SELECT p.seq, p.ts, sum({PART}) AS s FROM tider_postings p JOIN q ON q.term = p.term
          WHERE p.memory_id = %(m)s AND p.term = ANY(%(essential)s) AND p.ts <= %(asked)s GROUP BY p.seq, p.ts),
    top AS (SELECT h.seq, h.ts, (h.s + coalesce({extra}, 0))::real AS score FROM h
            ORDER BY score DESC, h.ts, h.seq LIMIT %(depth)s)
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
