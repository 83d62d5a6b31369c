"""Dense index in faiss (inner product on unit vectors == cosine); faiss id = row, the
order messages were added in (``tider.memory``).

Rows never move, so an ``add`` only appends to faiss, whatever the messages' times. Below
``hnsw_min_messages`` the index is an exact ``IndexFlatIP``. From there on it is an HNSW
graph over whole chunks of ``CHUNK`` rows plus an exact flat *tail* of the rows past the
last whole chunk: the graph is always built from the same chunks in the same order, so
the index (and every search) is the same whether the rows came in one ``add`` or many.
The tail joins the graph when it fills a chunk (the segment merge).

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


class FaissRows:
    def __init__(self, dim: int, hnsw_min_messages: int, hnsw_m: int = 32):
        import faiss

        self.dim, self.hnsw_min, self.hnsw_m = dim, hnsw_min_messages, hnsw_m
        self.flat = faiss.IndexFlatIP(dim)  # every row until HNSW takes over, then the tail only
        self.hnsw = None
        self.graph_rows = 0  # rows [0, graph_rows) are in the HNSW graph
        self.n = 0
        self.vectors = np.zeros((0, dim), dtype=np.float32)  # every row (the store's array, not a copy)

    def add(self, vectors_all: np.ndarray) -> None:
        """Catch up with ``vectors_all`` (all rows, in row order): index rows ``n ..``."""
        import faiss

        n_all = len(vectors_all)
        self.vectors = vectors_all
        if n_all >= self.hnsw_min and self.hnsw is None:
            self.hnsw = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        if self.hnsw is not None:
            whole = (n_all // CHUNK) * CHUNK
            for lo in range(self.graph_rows, whole, CHUNK):
                self.hnsw.add(np.ascontiguousarray(vectors_all[lo:lo + CHUNK]))
            if whole > self.graph_rows:
                self.graph_rows = whole
                self.flat.reset()
                self.flat.add(np.ascontiguousarray(vectors_all[whole:]))
            else:
                self.flat.add(np.ascontiguousarray(vectors_all[self.n:]))
        else:
            self.flat.add(np.ascontiguousarray(vectors_all[self.n:]))
        self.n = n_all

    def search(self, query: np.ndarray, k: int, past, ef_search: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(rows, scores)`` among the rows ``past`` allows (see ``_selector``);
        graph and tail hits are concatenated, not merged."""
        import faiss

        q = np.ascontiguousarray(np.asarray(query, dtype=np.float32).reshape(1, -1))
        if self.hnsw is not None and past is not None:
            allowed = np.arange(min(int(past), self.n)) if isinstance(past, (int, np.integer)) else np.flatnonzero(past)
            if len(allowed) < self.hnsw_min:  # a narrow filter: exact over the allowed rows
                scores = self.vectors[allowed] @ q[0] if len(allowed) else np.zeros(0, dtype=np.float32)
                top = np.argpartition(-scores, k - 1)[:k] if k < len(allowed) else np.arange(len(allowed))
                return allowed[top].astype(np.int64), scores[top]
        rows, scores = [], []
        if self.hnsw is not None and self.graph_rows:
            sel, _bits = _selector(past, 0, self.graph_rows)
            params = faiss.SearchParametersHNSW(sel=sel, efSearch=max(ef_search, k))
            s, i = self.hnsw.search(q, min(k, self.graph_rows), params=params)
            rows.append(i[0]), scores.append(s[0])
        tail_start = self.graph_rows if self.hnsw is not None else 0
        if self.flat.ntotal:
            sel, _bits = _selector(past, tail_start, self.n)
            params = faiss.SearchParameters(sel=sel) if sel is not None else None
            s, i = self.flat.search(q, min(k, self.flat.ntotal), params=params)
            rows.append(np.where(i[0] >= 0, i[0] + tail_start, -1)), scores.append(s[0])
        if not rows:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        r, s = np.concatenate(rows), np.concatenate(scores)
        keep = r >= 0
        return r[keep].astype(np.int64), s[keep]

    # -- persistence (only the graph: the flat tail is rebuilt from the vectors) --------
    def save(self, folder: Path) -> None:
        import faiss

        folder.mkdir(parents=True, exist_ok=True)
        if self.hnsw is not None:
            faiss.write_index(self.hnsw, str(folder / "hnsw.faiss"))

    @classmethod
    def load(cls, folder: Path | None, meta: dict | None, dim: int, hnsw_min_messages: int, hnsw_m: int,
             vectors_all: np.ndarray) -> "FaissRows":
        import faiss

        index = cls(dim, hnsw_min_messages, hnsw_m)
        graph_rows = int((meta or {}).get("graph_rows", 0))
        if folder is not None and graph_rows and (folder / "hnsw.faiss").exists() and graph_rows <= len(vectors_all):
            index.hnsw = faiss.read_index(str(folder / "hnsw.faiss"))
            index.graph_rows = index.n = graph_rows
        index.add(vectors_all)
        return index
