"""How a memory's vectors and terms were made, recorded with it (both backends): a memory
refuses to be opened with other index settings or another embedder, and says how to
re-index (``tider memory reindex``)."""

from __future__ import annotations

from tider.memory.files import StoreError
from tider.retrieval.config import RetrievalConfig

# Config fields an index is built with: a store refuses to open with other values.
BUILD_FIELDS = (
    "embedding_model",
    "embed_template",
    "embed_chunking",
    "bm25_backend",
    "bm25_method",
    "lexical_language",
    "lexical_stemmer",
    "metadata_fields",
    "timeline",
    "hnsw_m",
    "hnsw_min_messages",
)
# Timeline settings an older tider recorded in a store's manifest and this code no longer has.
# None changed what a store holds or returns (summary_words sized summaries nothing read), so
# they are dropped on opening, whatever their value.
REMOVED_TIMELINE_SETTINGS = ("summary_words",)
# Build settings added since stores recorded their config, with the value every store built
# before them has: its BM25 terms are plain words (no stems) and a long message has one vector
# (its first window), whatever today's defaults are.
ADDED_BUILD_SETTINGS = {"lexical_language": "english", "lexical_stemmer": "none", "embed_chunking": "none"}
REINDEX_HINT = "re-index it with `tider memory reindex --store {where}{name}` (keeps every message)"


def stored_config(config: dict) -> RetrievalConfig:
    """The ``RetrievalConfig`` a manifest records, less ``REMOVED_TIMELINE_SETTINGS``, plus
    ``ADDED_BUILD_SETTINGS`` where it predates them."""
    if isinstance(config.get("timeline"), dict):
        timeline = {k: v for k, v in config["timeline"].items() if k not in REMOVED_TIMELINE_SETTINGS}
        config = {**config, "timeline": timeline}
    return RetrievalConfig.from_json({**ADDED_BUILD_SETTINGS, **config})


def check_build(stored: RetrievalConfig, config: RetrievalConfig, embedder, where: str, hint: str) -> None:
    """Refuse to open a store built with other index settings, or with another embedder,
    than ``config`` / ``embedder`` ask for, saying how to re-index (``hint``)."""
    for f in BUILD_FIELDS:
        if getattr(config, f) != getattr(stored, f):
            raise StoreError(
                f"{where}: built with {f}={getattr(stored, f)!r}, opened with {getattr(config, f)!r}; {hint}"
            )
    check_embedder(stored, embedder, where, hint)


def check_embedder(stored: RetrievalConfig, embedder, where: str, hint: str) -> None:
    """An embedder object whose model is not the store's would search other vectors."""
    from tider.retrieval.embed import embedding_model_id

    given = getattr(embedder, "model_id", None)  # embedders of other makes name no model: trusted
    if given is not None and given != embedding_model_id(stored.embedding_model):
        raise StoreError(
            f"{where}: built with the embedder {embedding_model_id(stored.embedding_model)!r}, "
            f"opened with {given!r}; {hint}"
        )


def built_with(config: RetrievalConfig, dim: int, embedder=None) -> dict:
    """What a store records of how its vectors and terms were made (both backends); the
    chunking names the embedder's window (``tider.retrieval.embed.chunking_id``)."""
    from tider.retrieval.embed import chunking_id, embedding_model_id

    return {
        "model": embedding_model_id(config.embedding_model),
        "dim": dim,
        "template": config.embed_template,
        "chunking": chunking_id(embedder, config.embed_chunking),
        "lexical": config.lexical().id,
    }
