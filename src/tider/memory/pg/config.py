"""Settings of the PostgreSQL backend, and the errors it raises.

Retrieval settings (depths, RRF, the HNSW threshold, the timeline) stay in
``RetrievalConfig`` and mean the same on both backends; what is here is about the
database: how long to wait for it, how many connections to hold, how deep the HNSW
search goes, how much memory an index build may use.
"""

from __future__ import annotations

from dataclasses import dataclass

from tider.memory.files import StoreError


class DatabaseUnavailable(StoreError):
    """The database cannot be reached (or stopped answering) within the configured wait."""


@dataclass(frozen=True)
class PostgresConfig:
    # Seconds to wait for a connection (a new one, or a free one from the pool) before
    # DatabaseUnavailable; the same bound applies when the server goes away mid-run.
    connect_timeout_s: float = 10.0
    statement_timeout_s: float = 120.0  # a single statement; 0 = none (index builds run without)
    pool_min: int = 1
    pool_max: int = 8
    # Dense candidates from the HNSW index (the walk's hnsw.ef_search, at most 1000, is this
    # scaled by how much of the memory the query may see). The exact path returns
    # rrf_depth (1000) like the embedded store. pgvector's walk costs about 0.06 ms per
    # candidate at 100k messages here (faiss: 0.01), so 1000 would cost ~60 ms a search; on
    # LoCoMo dev a dense list of 200 instead of 1000 left recall@20 unchanged (150: rules
    # -0.004, 100: -0.016; docs/benchmarks.md).
    hnsw_depth: int = 200
    # pgvector's defaults for the graph (16 links, not faiss's 32): at 100k messages an
    # insert and a search cost about half (docs/benchmarks.md).
    hnsw_m: int = 16
    hnsw_ef_construction: int = 64
    maintenance_work_mem: str = "512MB"  # for HNSW builds: a graph that does not fit builds far slower
    lexical: str = "bm25"  # bm25 (BM25 in SQL) | ts_rank (Postgres's own ranking, for comparison)

    def __post_init__(self):
        if self.lexical not in ("bm25", "ts_rank"):
            raise ValueError(f"lexical={self.lexical!r}: choose bm25 or ts_rank")
        if not 1 <= self.hnsw_depth <= 1000:
            raise ValueError(f"hnsw_depth={self.hnsw_depth}: pgvector searches 1 to 1000 candidates")
        if self.pool_min < 1 or self.pool_max < self.pool_min:
            raise ValueError(f"pool_min={self.pool_min}, pool_max={self.pool_max}: need 1 <= pool_min <= pool_max")
