"""Re-index a memory with today's build settings (``tider memory reindex``), either backend.

A store records the embedder, the vector dimension and the lexical analysis it was built
with and refuses to be searched with others (``tider.memory.built.check_build``).
Re-indexing builds a fresh memory beside the old one (``<name>.reindex``) from the old
one's messages, in their time order and with their keys, so positions and keys are kept;
the old vectors are reused when the embedder and template are unchanged, else every
message is embedded again; the chunks of messages longer than the embedder's window are
embedded (or read from the embedding cache) for the new memory's chunking. Only when the
new memory is complete does it take the old one's place (``swap``: a rename, one
transaction in PostgreSQL), so a reindex killed midway leaves the old memory as it was and
a rerun starts the new one over.
"""

from __future__ import annotations

from dataclasses import replace

from tider.memory.built import BUILD_FIELDS
from tider.retrieval.config import RetrievalConfig

SUFFIX = ".reindex"


def target_config(built: RetrievalConfig, wanted: RetrievalConfig | None) -> RetrievalConfig:
    """``built`` with the build settings of ``wanted`` (default: this tider's defaults)."""
    wanted = wanted or RetrievalConfig()
    return replace(built, **{f: getattr(wanted, f) for f in BUILD_FIELDS})


def reindex(backend, name: str, config: RetrievalConfig | None = None, embedder=None) -> dict:
    """Rebuild memory ``name`` of ``backend`` (``tider.memory.backends``) with ``config``'s
    build settings; returns what was done (messages, whether vectors were re-embedded)."""
    if not backend.exists(name):
        raise KeyError(f"no memory {name!r} in {backend.describe()}")
    old = backend.open(name)  # opened with the config it was built with: always opens
    try:
        messages = list(old.messages().messages)
        vectors = old.vectors_by_position()
        built, granularity = old.config, old.granularity
    finally:
        old.close()
    target = target_config(built, config)
    same_vectors = (target.embedding_model, target.embed_template) == (built.embedding_model, built.embed_template)
    tmp = name + SUFFIX
    backend.drop(tmp)  # what an interrupted reindex left
    new = backend.open(tmp, config=target, embedder=embedder, granularity=granularity)
    try:
        # kept vectors are this embedder's: the long messages' chunks are embedded beside them
        # (read back from the embedding cache where an earlier build embedded them)
        new.add(messages, vectors=vectors if same_vectors and len(messages) else None, embed_chunks=True)
        if len(new) != len(messages):
            raise RuntimeError(f"reindex of {name!r}: {len(messages)} messages, the new memory holds {len(new)}")
    finally:
        new.close()
    backend.swap(tmp, name)
    return {"memory": name, "messages": len(messages), "re_embedded": not same_vectors}
