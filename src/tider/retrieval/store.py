"""``RetrievalStore``: everything retrieval needs for a dataset, built once per process.

Per memory key (lazily, on first use): message embeddings (on-disk cached), the
timeline, the BM25 index over metadata-expanded text, the faiss index, and a
``DualChannelRetriever``. Per query (cached by query key): the window-independent
similarity vector and its semantic order, so ``retrieve``/``coverage`` for a new window
prediction only recompute the temporal channel and the rerank (tens of microseconds on a
LoCoMo-size memory: fast enough for a GRPO reward, see ``bench/bench_coverage.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from tider.scoring import evidence_coverage
from tider.retrieval.bm25 import BM25Index
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.dense import DenseIndex
from tider.retrieval.embed import Embedder, embedding_text
from tider.retrieval.retriever import DualChannelRetriever
from tider.retrieval.timeline import Timeline, build_timeline
from tider.types import Dataset, Memory, Query, WindowPrediction


@dataclass
class MemoryIndexes:
    memory: Memory
    embeddings: np.ndarray
    timeline: Timeline
    bm25: BM25Index
    dense: DenseIndex
    retriever: DualChannelRetriever


class RetrievalStore:
    def __init__(self, dataset: Dataset, config: RetrievalConfig | None = None, embedder: Embedder | None = None):
        self.dataset = dataset
        self.config = config or RetrievalConfig()
        self.embedder = embedder or Embedder(self.config.embedding_model, self.config.embedding_cache_dir)
        self._indexes: dict[str, MemoryIndexes] = {}
        self._sim: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        self._query_vectors: dict[str, np.ndarray] = {}

    # -- per memory -------------------------------------------------------------------
    def indexes(self, memory_key: str) -> MemoryIndexes:
        if memory_key not in self._indexes:
            if memory_key not in self.dataset.memories:
                raise KeyError(f"memory {memory_key!r} not in dataset {self.dataset.name!r}")
            memory = self.dataset.memories[memory_key]
            if not len(memory):
                raise ValueError(f"memory {memory_key!r} of dataset {self.dataset.name!r} has no messages: "
                                 "nothing to index or retrieve")
            cfg = self.config
            emb = self.embedder.encode([embedding_text(m, cfg.embed_template) for m in memory])
            timeline = build_timeline(memory, self.embedder, cfg.timeline, embeddings=emb)
            bm25 = BM25Index.from_messages(memory.messages, cfg.metadata_fields, cfg.bm25_backend, cfg.bm25_method)
            dense = DenseIndex(emb, kind=cfg.faiss_index)
            retriever = DualChannelRetriever(memory, bm25, dense, cfg, self.embedder)
            self._indexes[memory_key] = MemoryIndexes(memory, emb, timeline, bm25, dense, retriever)
        return self._indexes[memory_key]

    def memory(self, memory_key: str) -> Memory:
        return self.dataset.memories[memory_key]

    def timeline(self, memory_key: str) -> Timeline:
        return self.indexes(memory_key).timeline

    # -- per query --------------------------------------------------------------------
    def prepare(self, queries: Iterable[Query]) -> None:
        """Encode all query texts in one batch (fills the embedding cache)."""
        queries = [q for q in queries if q.text not in self._query_vectors]
        if queries:
            texts = list(dict.fromkeys(q.text for q in queries))
            for t, v in zip(texts, self.embedder.encode(texts)):
                self._query_vectors[t] = v

    def query_vector(self, query: Query) -> np.ndarray:
        if query.text not in self._query_vectors:
            self.prepare([query])
        return self._query_vectors[query.text]

    def similarity(self, query: Query, mode: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(sim, semantic_order)`` for the query on its memory, cached."""
        mode = mode or self.config.semantic
        key = (query.memory_key + "\x00" + query.key + "\x00" + query.text, mode)
        if key not in self._sim:
            retriever = self.indexes(query.memory_key).retriever
            sim = retriever.similarity(query.text, self.query_vector(query) if mode != "bm25" else None, mode)
            self._sim[key] = (sim, np.lexsort((np.arange(sim.shape[0]), -sim)))
        return self._sim[key]

    def retrieve(self, query: Query, prediction: WindowPrediction, k: int | None = None,
                 mode: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Dual-channel ``(ids, scores)``, best first."""
        sim, order = self.similarity(query, mode)
        return self.indexes(query.memory_key).retriever.rank(sim, prediction, k, semantic_order=order)

    def coverage(self, query: Query, prediction: WindowPrediction, k: int | None = None,
                 gold_ids: Sequence[int] | None = None) -> float:
        """``evidence_coverage`` of the top-k for ``prediction`` (the GRPO reward). Gold
        evidence comes from ``gold_ids`` or, in training, ``query.gold.evidence_ids``."""
        k = self.config.k if k is None else k
        ids, _ = self.retrieve(query, prediction, k)
        gold = query.gold.evidence_ids if gold_ids is None else gold_ids
        return evidence_coverage(ids.tolist(), gold, k)

    def coverage_batch(self, queries: Sequence[Query], predictions: Sequence[WindowPrediction], k: int | None = None) -> list[float]:
        self.prepare(queries)
        return [self.coverage(q, p, k) for q, p in zip(queries, predictions)]
