"""Build one store per conversation of a benchmark: ``tider memory import``.

Memory names are the conversation keys with anything outside ``[A-Za-z0-9._-]`` turned
into ``_`` (what the HTTP service accepts). Messages keep their source keys, so running
the import again adds nothing twice: an interrupted import resumes where it stopped.
"""

from __future__ import annotations

import re
from pathlib import Path

from tider.memory.temporal_memory import TemporalMemory
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
    """``{store name: messages}`` for every memory imported into ``out/<name>``."""
    from tqdm.auto import tqdm

    if embedder is None:
        from tider.retrieval.embed import Embedder

        cfg = config or RetrievalConfig()
        embedder = Embedder(cfg.embedding_model, cfg.embedding_cache_dir)
    keys = list(dataset.memories)[:limit]
    names = [store_name(k) for k in keys]
    if len(set(names)) != len(names):
        raise ValueError(f"dataset {dataset.name!r}: memory keys collide as store names")
    counts = {}
    for key, name in tqdm(list(zip(keys, names)), desc="import", disable=not progress):
        with TemporalMemory(
            Path(out) / name, config=config, embedder=embedder, name=name, granularity=dataset.granularity
        ) as mem:
            mem.add(dataset.memories[key].messages)
            mem.timeline()  # built once here, saved with the store
            counts[name] = len(mem)
    return counts
