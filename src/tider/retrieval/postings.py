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
a removed row keeps its number and scores 0.
"""

from __future__ import annotations

import bisect
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tider.retrieval.lexical import LexicalAnalysis

K1, B = 1.5, 0.75  # bm25s's defaults


class Postings:
    """``add`` token lists (one per row), ``scores(query)`` -> ``(n,)`` float32 by row."""

    def __init__(self, analysis: LexicalAnalysis):
        self.analysis = analysis
        self.tokens: list[list[str] | None] = []  # per row (None: removed): what a save writes
        self._rows: dict[str, list[int]] = {}
        self._tfs: dict[str, list[int]] = {}
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # per term, dropped when it grows
        self._lengths = np.zeros(1024, dtype=np.int64)
        self.n_rows = 0  # rows ever added, removed ones included
        self.n_live = 0  # the N of the statistics
        self.total_length = 0

    def add(self, token_lists: Sequence[Sequence[str] | None]) -> None:
        """Append one row per token list (None: a removed row, which holds a number only)."""
        need = self.n_rows + len(token_lists)
        if need > len(self._lengths):
            size = max(need, 2 * len(self._lengths))
            self._lengths = np.concatenate([self._lengths, np.zeros(size - len(self._lengths), np.int64)])
        for terms in token_lists:
            row = self.n_rows
            self.n_rows += 1
            self.tokens.append(None if terms is None else list(terms))
            if terms is None:
                continue
            for term, tf in Counter(terms).items():
                self._rows.setdefault(term, []).append(row)
                self._tfs.setdefault(term, []).append(tf)
                self._arrays.pop(term, None)
            self._lengths[row] = max(len(terms), 1)
            self.total_length += max(len(terms), 1)
            self.n_live += 1

    def remove(self, rows: Sequence[int]) -> None:
        """Take rows out: O(the postings of their terms)."""
        for row in sorted({int(r) for r in rows}):
            terms = self.tokens[row]
            if terms is None:
                continue
            for term in Counter(terms):
                at = bisect.bisect_left(self._rows[term], row)  # rows are appended in order
                del self._rows[term][at], self._tfs[term][at]
                self._arrays.pop(term, None)
                if not self._rows[term]:
                    del self._rows[term], self._tfs[term]
            self.total_length -= int(self._lengths[row])
            self._lengths[row] = 0
            self.tokens[row] = None
            self.n_live -= 1

    def _postings(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        if term not in self._arrays:
            rows = np.asarray(self._rows[term], dtype=np.int64)
            self._arrays[term] = rows, np.asarray(self._tfs[term], dtype=np.float64)
        return self._arrays[term]

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
