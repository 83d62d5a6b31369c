"""Every retrieval parameter in one dataclass, with the paper defaults and their units.

TIDER defaults (its Table 13): k=20, timeline Delta_date=7 days, theta_sem=0.85 (see
``TimelineConfig`` for why not here), cap=40. The channels are fused by reciprocal rank
(``tider.retrieval.retriever`` says why TIDER's distance-decay rerank is not used).
Durations are stored in *days* (floats), so hour-scale data just uses fractions
(12 h == 0.5).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import Literal

SemanticMode = Literal["dense", "bm25", "hybrid"]
SEMANTIC_MODES = ("dense", "bm25", "hybrid")


def days(value: float) -> timedelta:
    return timedelta(days=value)


@dataclass
class TimelineConfig:
    """Event-cluster construction (TIDER Table 13).

    A message joins the open cluster when it is within ``delta_date_days`` of the
    cluster's last message, its cosine similarity to the cluster (``similarity``:
    ``centroid`` = mean embedding, ``max`` = best member) reaches ``theta_sem``, and the
    cluster holds fewer than ``cap`` members.

    Default ``theta_sem=0.35`` with centroid similarity, not the paper's 0.85: measured on
    LoCoMo dev with MiniLM (``bench/sweep_timeline.py``), 0.85 yields one cluster per turn
    (4,110 entries for the 4,124 messages of 7 conversations, useless as a K=30 prompt),
    0.35 yields 405 (58 per conversation). K itself is a prompt setting (the recipes'
    ``prompt_lines``, recorded in the locator's metadata).
    """

    delta_date_days: float = 7.0
    theta_sem: float = 0.35
    cap: int = 40
    similarity: Literal["centroid", "max"] = "centroid"


@dataclass
class DBSCANConfig:
    """T-Mem Temporal Evidence Discovery (Sec. 4.2, App. C), durations in days.

    Paper values (hour-scale): eps 12 h, minPts 2, delta 2 h, mu 0.25 anchors/h,
    padding 12 h, seeds = BM25 top-36 with the asking user added to the query.
    ``mu_per_day`` is anchors per day (0.25/h == 6/day). ``max_windows`` (None = keep all
    clusters above mu, the paper's rule) keeps only the densest few; it is the knob the
    tuned variant adds.
    """

    seeds: int = 36
    eps_days: float = 0.5
    min_pts: int = 2
    delta_days: float = 2 / 24
    mu_per_day: float = 6.0
    pad_days: float = 0.5
    max_windows: int | None = None


# Settings of TIDER's distance-decay rerank, replaced by rank fusion (``retriever``): a
# config or a store manifest that holds them at their old defaults still loads; another
# value asked for a fusion this code no longer has.
REMOVED_FUSION_SETTINGS = {"lambda_boost": 0.3, "gamma_min": 0.3, "rho_per_day": 0.05, "tau_buf_days": 14.0}
LAST_COMMIT_WITH_THEM = "fa11d15"


def drop_removed(data: dict) -> dict:
    """``data`` without the removed fusion settings; raises if one holds another value."""
    for name, default in REMOVED_FUSION_SETTINGS.items():
        if name in data and data[name] != default:
            raise ValueError(
                f"retrieval setting {name}={data[name]!r} belongs to the distance-decay rerank, which rank fusion "
                f"replaced (tider.retrieval.retriever); commit {LAST_COMMIT_WITH_THEM} is the last that has it"
            )
    return {k: v for k, v in data.items() if k not in REMOVED_FUSION_SETTINGS}


@dataclass
class RetrievalConfig:
    """Dual-channel retrieval (see ``tider.retrieval.retriever`` for the formula)."""

    k: int = 20
    semantic: SemanticMode = "hybrid"
    rrf_k: int = 60  # the RRF constant of both fusions: dense with BM25, and semantic with temporal
    temporal: bool = True  # False: every query takes the semantic-only path
    # No memory from the future: rank only messages at or before the query's asked_at
    # (every window source alike, the oracle included). False: the whole memory.
    past_only: bool = True
    rrf_depth: int = 1000  # RRF cut-off: ranks past it contribute 0 (see channels)
    # Index-backed search (tider.memory.index): memories with fewer messages are scored
    # exactly (every message), which keeps small-memory results identical to the exact path.
    index_min_messages: int = 20_000
    index_depth: int = 1000  # dense candidates from faiss per query (= rrf_depth: exact RRF over exact lists)
    hnsw_min_messages: int = 50_000  # faiss HNSW above, exact IndexFlatIP below
    hnsw_m: int = 32
    hnsw_ef_search: int = 128  # raised to index_depth when smaller
    # Indexes
    embedding_model: str | None = None  # None: the offline all-MiniLM-L6-v2 package
    # What the dense index embeds per message. With the speaker name, MiniLM recall@20 on
    # LoCoMo dev goes 0.355 -> 0.504 (questions name people; measured, see README).
    embed_template: str = "{speaker}: {text}"
    embedding_cache_dir: str | None = None  # None: $TIDER_CACHE or .cache/tider/embeddings
    # A message longer than the embedder's window: "window" embeds its tail too, as
    # overlapping window-sized chunks, and its dense score is its best chunk's
    # (tider.retrieval.embed); "none": only its first window is ever seen.
    embed_chunking: Literal["window", "none"] = "window"
    bm25_backend: Literal["bm25s", "rank_bm25"] = "bm25s"
    bm25_method: str = "lucene"
    # The lexical analysis both backends index and query with (tider.retrieval.lexical):
    # stop words of this language out, then its Snowball stems ("none": plain words).
    lexical_language: str = "english"
    lexical_stemmer: Literal["snowball", "none"] = "snowball"
    metadata_fields: tuple[str, ...] = ("speaker", "channel", "phase", "topic", "role")
    timeline: TimelineConfig = field(default_factory=TimelineConfig)

    def __post_init__(self) -> None:
        if self.semantic not in SEMANTIC_MODES:
            raise ValueError(f"semantic mode {self.semantic!r} unknown; choose one of {SEMANTIC_MODES}")
        if self.embed_chunking not in ("window", "none"):
            raise ValueError(f"embed_chunking {self.embed_chunking!r} unknown; choose window or none")
        if isinstance(self.timeline, dict):
            self.timeline = TimelineConfig(**self.timeline)
        self.metadata_fields = tuple(self.metadata_fields)
        self.lexical()  # an unknown language or stemmer fails here, not at the first search

    def lexical(self):
        """The ``LexicalAnalysis`` these settings name."""
        from tider.retrieval.lexical import LexicalAnalysis

        return LexicalAnalysis(self.lexical_language, self.lexical_stemmer)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def load(cls, path: str | os.PathLike) -> RetrievalConfig:
        """A YAML (``.yaml``/``.yml``) or JSON file of these fields, e.g. configs/retrieval/default.yaml."""
        text = Path(path).read_text()
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            return cls.from_json(yaml.safe_load(text) or {})
        return cls.from_json(json.loads(text))

    @classmethod
    def from_json(cls, data: dict) -> RetrievalConfig:
        known = {f.name for f in fields(cls)}
        data = drop_removed(data)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown retrieval config keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)
