"""Build one memory per conversation of a benchmark: ``tider memory import``.

The target is a directory (one embedded store per memory) or a PostgreSQL URL (one
database, every memory in it; ``tider.memory.backends``). Memory names are the
conversation keys with anything outside ``[A-Za-z0-9._-]`` turned into ``_`` (what the
HTTP service accepts). Messages keep their source keys, so running the import again adds
nothing twice: an interrupted import resumes where it stopped.
"""

from __future__ import annotations

import re
from pathlib import Path

from tider.memory.backends import DirectoryBackend, open_backend
from tider.retrieval.config import RetrievalConfig
from tider.types import Dataset


def store_name(memory_key: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", memory_key).lstrip("._-") or "memory"
    return name[:64]


def import_dataset(
    dataset: Dataset,
    out: str | Path,
    config: RetrievalConfig | None = None,
    embedder=None,
    limit: int | None = None,
    progress: bool = True,
) -> dict[str, int]:
    """``{memory name: messages}`` for every memory imported into ``out`` (a URL or a directory)."""
    from tqdm.auto import tqdm

    if embedder is None:
        from tider.retrieval.embed import shared_embedder

        cfg = config or RetrievalConfig()
        embedder = shared_embedder(cfg.embedding_model, cfg.embedding_cache_dir)
    keys = list(dataset.memories)[:limit]
    names = [store_name(k) for k in keys]
    if len(set(names)) != len(names):
        raise ValueError(f"dataset {dataset.name!r}: memory keys collide as store names")
    counts = {}
    backend = open_backend(out if isinstance(out, str) else Path(out))
    try:
        for key, name in tqdm(list(zip(keys, names)), desc="import", disable=not progress):
            with backend.open(name, config=config, embedder=embedder, granularity=dataset.granularity) as mem:
                mem.add(dataset.memories[key].messages)
                if isinstance(backend, DirectoryBackend):
                    mem.timeline()  # built once here, saved with the store (a database keeps it with each add)
                counts[name] = len(mem)
    finally:
        backend.close()
    return counts
