"""Dense index: L2-normalised vectors in faiss, inner product == cosine.

``flat`` (exact ``IndexFlatIP``) is the default; ``hnsw`` (``IndexHNSWFlat``, inner
product) and ``ivf`` (``IndexIVFFlat``, trained on the corpus) trade exactness for speed
on large memories. Row i is message id i, and ids are sorted by time, so a time window
is an id range and in-window search is ``faiss.IDSelectorRange`` (a search parameter, no
copy of the index). The vectors are kept too: they give the full score vector the store
caches per query, and the save format (``faiss.write_index`` + ``.npy``) needs no pickle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

KINDS = ("flat", "hnsw", "ivf")


class DenseIndex:
    def __init__(self, vectors: np.ndarray, kind: str = "flat", hnsw_m: int = 32, ivf_lists: int | None = None,
                 nprobe: int = 16):
        import faiss

        if kind not in KINDS:
            raise ValueError(f"unknown faiss index kind {kind!r}; known: {KINDS}")
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.kind, self.nprobe = kind, nprobe
        n, dim = self.vectors.shape
        if kind == "flat":
            self.index = faiss.IndexFlatIP(dim)
        elif kind == "hnsw":
            self.index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        else:
            lists = ivf_lists or max(1, int(np.sqrt(max(n, 1))))
            self.index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, lists, faiss.METRIC_INNER_PRODUCT)
            self.index.train(self.vectors)
        if n:
            self.index.add(self.vectors)

    def __len__(self) -> int:
        return self.vectors.shape[0]

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    def scores(self, query: np.ndarray) -> np.ndarray:
        """Cosine of the query with every row, ``(n,)`` (exact, whatever the index kind)."""
        return self.vectors @ np.asarray(query, dtype=np.float32).reshape(-1)

    def _params(self, id_range: tuple[int, int] | None):
        import faiss

        if id_range is None and self.kind != "ivf":
            return None, None
        sel = faiss.IDSelectorRange(int(id_range[0]), int(id_range[1])) if id_range is not None else None
        if self.kind == "hnsw":
            return faiss.SearchParametersHNSW(sel=sel), sel
        if self.kind == "ivf":
            return faiss.SearchParametersIVF(sel=sel, nprobe=self.nprobe), sel
        return faiss.SearchParameters(sel=sel), sel

    def search(self, queries: np.ndarray, k: int, id_range: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(ids, scores)`` per query row (``-1`` ids pad short results).
        ``id_range=(lo, hi)`` restricts the search to ids ``lo <= id < hi``."""
        q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        params, _sel = self._params(id_range)  # keep the selector alive during the search
        k = max(1, min(k, len(self))) if len(self) else 1
        scores, ids = self.index.search(q, k, params=params) if params is not None else self.index.search(q, k)
        return ids, scores

    def save(self, directory: str | Path) -> None:
        import faiss

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / "vectors.npy", self.vectors, allow_pickle=False)
        faiss.write_index(self.index, str(directory / "index.faiss"))
        (directory / "dense_meta.json").write_text(json.dumps({"kind": self.kind, "nprobe": self.nprobe}))

    @classmethod
    def load(cls, directory: str | Path) -> "DenseIndex":
        import faiss

        directory = Path(directory)
        meta = json.loads((directory / "dense_meta.json").read_text())
        obj = cls.__new__(cls)
        obj.vectors = np.load(directory / "vectors.npy", allow_pickle=False)
        obj.kind, obj.nprobe = meta["kind"], meta["nprobe"]
        obj.index = faiss.read_index(str(directory / "index.faiss"))
        return obj


def range_union_search(index: DenseIndex, query: np.ndarray, k: int, ranges: Sequence[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` over the union of id ranges: one ``IDSelectorRange`` search per range, merged."""
    ids, scores = [], []
    for lo, hi in ranges:
        if hi > lo:
            i, s = index.search(query, min(k, hi - lo), id_range=(lo, hi))
            keep = i[0] >= 0
            ids.append(i[0][keep])
            scores.append(s[0][keep])
    if not ids:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    ids_all, scores_all = np.concatenate(ids), np.concatenate(scores)
    order = np.lexsort((ids_all, -scores_all))[:k]
    return ids_all[order], scores_all[order]
