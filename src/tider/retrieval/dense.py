"""Dense index in faiss (inner product on unit vectors == cosine); faiss id = row, the
order messages were added in (``tider.memory``).

Rows never move, so an ``add`` only appends, whatever the messages' times. Below
``hnsw_min_messages`` search is exact (a brute-force product with the store's own array:
a faiss ``IndexFlatIP`` would only copy it). From there on it is a faiss HNSW graph over
whole chunks of ``CHUNK`` rows plus the exact *tail* past the last whole chunk: the graph
is always built from the same chunks in the same order, so the index (and every search)
is the same whether the rows came in one ``add`` or many. The tail joins the graph when
it fills a chunk (the segment merge).

"Only the past" is a faiss ``IDSelector``: a row range when rows are in time order (the
usual append), else a bitmap of the rows at or before ``asked_at``. A filter that keeps
fewer than ``hnsw_min_messages`` rows is searched exactly instead: filtered HNSW loses
recall as the filter narrows (the graph walk must pass through rows it may not return).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHUNK = 4096


def _selector(past, lo: int, hi: int):
    """``(selector over ids 0 .. hi - lo, keep-alive)`` for the rows ``lo .. hi`` that ``past``
    allows: None (all), an int (rows before it: a range) or a bool mask over all rows."""
    import faiss

    if past is None:
        return None, None
    if isinstance(past, (int, np.integer)):
        return faiss.IDSelectorRange(0, max(0, min(int(past), hi) - lo)), None
    bits = np.packbits(past[lo:hi], bitorder="little")
    return faiss.IDSelectorBitmap(hi - lo, faiss.swig_ptr(bits)), bits


def exact_top(vectors: np.ndarray, query: np.ndarray, k: int, rows: np.ndarray | None = None):
    """Top-``k`` ``(rows, scores)`` by brute force over ``vectors`` (or its ``rows``): the
    same matrix-vector product exact scoring uses, so equal inputs give equal floats."""
    if rows is not None and 4 * len(rows) >= len(vectors):  # most rows: no copy of them (a mask, dead rows)
        scores = (vectors @ query)[rows] if len(vectors) else np.zeros(0, dtype=np.float32)
    else:
        block = vectors if rows is None else vectors[rows]
        scores = block @ query if len(block) else np.zeros(0, dtype=np.float32)
    top = np.argpartition(-scores, k - 1)[:k] if 0 < k < len(scores) else np.arange(len(scores))
    ids = top if rows is None else rows[top]
    return ids.astype(np.int64), scores[top]


class FaissRows:
    """HNSW over whole chunks of rows (from ``hnsw_min_messages`` on) plus brute force
    over the rest: the rows themselves are the store's array (no copy)."""

    def __init__(self, dim: int, hnsw_min_messages: int, hnsw_m: int = 32):
        self.dim, self.hnsw_min, self.hnsw_m = dim, hnsw_min_messages, hnsw_m
        self.hnsw = None
        self.graph_rows = 0  # rows [0, graph_rows) are in the HNSW graph; the rest is the exact tail
        self.n = 0
        self.vectors = np.zeros((0, dim), dtype=np.float32)  # every row (the store's array, not a copy)

    def add(self, vectors_all: np.ndarray) -> None:
        """Catch up with ``vectors_all`` (all rows, in row order): whole chunks join the graph."""
        import faiss

        self.vectors, self.n = vectors_all, len(vectors_all)
        if self.n >= self.hnsw_min and self.hnsw is None:
            self.hnsw = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        if self.hnsw is not None:
            whole = (self.n // CHUNK) * CHUNK
            for lo in range(self.graph_rows, whole, CHUNK):
                self.hnsw.add(np.ascontiguousarray(vectors_all[lo : lo + CHUNK]))
            self.graph_rows = max(self.graph_rows, whole)

    def search(self, query: np.ndarray, k: int, past, ef_search: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(rows, scores)`` among the rows ``past`` allows (see ``_selector``);
        graph and tail hits are concatenated, not merged."""
        import faiss

        q = np.ascontiguousarray(np.asarray(query, dtype=np.float32).reshape(-1))
        prefix = isinstance(past, (int, np.integer))
        allowed = np.flatnonzero(past) if past is not None and not prefix else None
        n_allowed = self.n if past is None else (min(int(past), self.n) if prefix else len(allowed))
        if not self.graph_rows or n_allowed < self.hnsw_min:  # no graph yet, or a filter too narrow for it
            return (
                exact_top(self.vectors[:n_allowed], q, k) if allowed is None else exact_top(self.vectors, q, k, allowed)
            )
        sel, _bits = _selector(past, 0, self.graph_rows)
        params = faiss.SearchParametersHNSW(sel=sel, efSearch=max(ef_search, k))
        s, i = self.hnsw.search(q.reshape(1, -1), min(k, self.graph_rows), params=params)
        keep = i[0] >= 0
        tail = np.arange(self.graph_rows, self.n)
        if past is not None:
            tail = tail[tail < int(past)] if prefix else tail[past[self.graph_rows : self.n]]
        t_rows, t_scores = exact_top(self.vectors, q, k, tail)
        return np.concatenate([i[0][keep].astype(np.int64), t_rows]), np.concatenate([s[0][keep], t_scores])

    # -- persistence (only the graph: the flat tail is rebuilt from the vectors) --------
    def save(self, folder: Path) -> None:
        import faiss

        folder.mkdir(parents=True, exist_ok=True)
        if self.hnsw is not None:
            faiss.write_index(self.hnsw, str(folder / "hnsw.faiss"))

    @classmethod
    def load(
        cls,
        folder: Path | None,
        meta: dict | None,
        dim: int,
        hnsw_min_messages: int,
        hnsw_m: int,
        vectors_all: np.ndarray,
    ) -> FaissRows:
        import faiss

        index = cls(dim, hnsw_min_messages, hnsw_m)
        graph_rows = int((meta or {}).get("graph_rows", 0))
        if folder is not None and graph_rows and (folder / "hnsw.faiss").exists() and graph_rows <= len(vectors_all):
            index.hnsw = faiss.read_index(str(folder / "hnsw.faiss"))
            index.graph_rows = index.n = graph_rows
        index.add(vectors_all)
        return index
