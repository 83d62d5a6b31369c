"""BM25 over postings that grow with each add: the embedded store's lexical index.

bm25s precomputes every posting's score from the corpus statistics (N, df, the mean
document length), so one added message changes them all and bm25s can only rebuild
(at 100k messages, two seconds before the first search after an add). Here the postings
hold what a message brings (term -> rows, term frequencies; a length per row) and the
scores are made at query time from today's statistics, as a search engine scores: an
add is O(its terms), a search O(the postings of the query's terms).

The arithmetic is bm25s's "lucene" variant with its defaults, step for step (idf = ln(1 +
(N - df + 0.5) / (df + 0.5)) stored in float32; its product with tf / (k1 (1 - b + b dl /
avgdl) + tf) in float64, rounded to float32 as bm25s stores a posting's score; a query
term counts once per occurrence, the parts summed in float32 in query order), so a memory scores every
message exactly as ``BM25Index`` over the same messages would (``tests/test_postings.py``),
and as the PostgreSQL backend's postings do (``tider.memory.pg.lexical``). An empty
message counts one placeholder term, as bm25s indexes it.

Rows are numbered in the order they were added and never move; ``tokens`` keeps each
row's terms. ``remove`` takes rows out (their postings, document frequencies, lengths:
the statistics are then those of the rows that remain, as if they had never been added);
a removed row keeps its number and scores 0. An add and a remove are O(their terms).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tider.retrieval.lexical import LexicalAnalysis

K1, B = 1.5, 0.75  # bm25s's defaults


def _grown(buf: np.ndarray | None, n: int, need: int, dtype) -> np.ndarray:
    """``buf`` (``n`` used) with room for ``need``: capacity doubles, so appends are O(1) amortised."""
    if buf is not None and need <= len(buf):
        return buf
    out = np.zeros(max(need, 2 * (0 if buf is None else len(buf)), 4), dtype=dtype)
    if buf is not None:
        out[:n] = buf[:n]
    return out


class Postings:
    """``add`` token lists (one per row), ``scores(query)`` -> ``(n,)`` float32 by row."""

    def __init__(self, analysis: LexicalAnalysis):
        self.analysis = analysis
        self.tokens: list[list[str] | None] = []  # per row (None: removed): what a save writes
        # per term: rows and term frequencies in growable arrays (the first _used[term]
        # entries), so neither an add nor the next search converts a list
        self._rows: dict[str, np.ndarray] = {}
        self._tfs: dict[str, np.ndarray] = {}
        self._used: dict[str, int] = {}
        self._gone: dict[str, int] = {}  # per term: entries of removed rows, filtered when scored
        self._lengths = np.zeros(0, dtype=np.int64)
        self._alive = np.zeros(0, dtype=bool)
        self.n_rows = 0  # rows ever added, removed ones included
        self.n_live = 0  # the N of the statistics
        self.total_length = 0

    def add(self, token_lists: Sequence[Sequence[str] | None]) -> None:
        """Append one row per token list (None: a removed row, which holds a number only)."""
        need = self.n_rows + len(token_lists)
        self._lengths = _grown(self._lengths, self.n_rows, need, np.int64)
        self._alive = _grown(self._alive, self.n_rows, need, bool)
        fresh: dict[str, tuple[list[int], list[int]]] = {}
        for terms in token_lists:
            row = self.n_rows
            self.n_rows += 1
            self.tokens.append(None if terms is None else list(terms))
            if terms is None:
                continue
            for term, tf in Counter(terms).items():
                rows, tfs = fresh.setdefault(term, ([], []))
                rows.append(row)
                tfs.append(tf)
            self._lengths[row] = max(len(terms), 1)
            self._alive[row] = True
            self.total_length += max(len(terms), 1)
            self.n_live += 1
        for term, (rows, tfs) in fresh.items():
            n = self._used.get(term, 0)
            self._rows[term] = _grown(self._rows.get(term), n, n + len(rows), np.int64)
            self._tfs[term] = _grown(self._tfs.get(term), n, n + len(rows), np.float64)
            self._rows[term][n : n + len(rows)] = rows
            self._tfs[term][n : n + len(rows)] = tfs
            self._used[term] = n + len(rows)

    def remove(self, rows: Sequence[int]) -> None:
        """Take rows out: O(their terms); their entries are skipped when a term is scored."""
        for row in sorted({int(r) for r in rows}):
            terms = self.tokens[row]
            if terms is None:
                continue
            for term in Counter(terms):
                self._gone[term] = self._gone.get(term, 0) + 1
                if self._gone[term] == self._used[term]:  # no live row holds it
                    for table in (self._rows, self._tfs, self._used, self._gone):
                        del table[term]
            self.total_length -= int(self._lengths[row])
            self._lengths[row] = 0
            self._alive[row] = False
            self.tokens[row] = None
            self.n_live -= 1

    def _postings(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """A term's live entries; removed ones are dropped from its arrays once they are half."""
        n = self._used[term]
        rows, tfs = self._rows[term][:n], self._tfs[term][:n]
        if self._gone.get(term):
            keep = self._alive[rows]
            rows, tfs = rows[keep], tfs[keep]
            if 2 * self._gone[term] >= n:
                self._rows[term], self._tfs[term] = rows.copy(), tfs.copy()
                self._used[term], self._gone[term] = len(rows), 0
        return rows, tfs

    def scores(self, query: str | Sequence[str]) -> np.ndarray:
        """Every row's BM25 score; a string query goes through the analysis."""
        tokens = self.analysis.terms(query) if isinstance(query, str) else list(query)
        out = np.zeros(self.n_rows, dtype=np.float32)
        n = self.n_live
        if not n:
            return out
        avgdl = self.total_length / n
        for term in tokens:  # each occurrence adds its part again, in query order, as bm25s does
            if term not in self._rows:
                continue
            rows, tfs = self._postings(term)
            df = len(rows)
            idf = np.float32(math.log(1 + (n - df + 0.5) / (df + 0.5)))
            norm = K1 * ((1 - B) + B * self._lengths[rows] / avgdl)
            out[rows] += (float(idf) * (tfs / (norm + tfs))).astype(np.float32)
        return out

    def save(self, directory: str | Path) -> None:
        """The token lists as JSON: loading re-counts them without analysing a text again."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        analysis = {"language": self.analysis.language, "stemmer": self.analysis.stemmer}
        (directory / "postings.json").write_text(json.dumps({"analysis": analysis, "tokens": self.tokens}))

    @classmethod
    def load(cls, directory: str | Path) -> Postings:
        data = json.loads((Path(directory) / "postings.json").read_text())
        index = cls(LexicalAnalysis(**data["analysis"]))
        index.add(data["tokens"])
        return index
