"""Datasets: loaders (LoCoMo, LongMemEval, generic JSONL), gold windows, synthetic benchmark.

``load_dataset(name, path, **options)`` is the one entry point; every loader returns a
``tider.types.Dataset`` whose queries carry gold labels only in ``Query.gold`` and whose
bad input raises ``DatasetError`` naming the file and the record.
"""

from __future__ import annotations

import importlib

from tider.data.errors import DatasetError
from tider.data.gold import gold_windows
from tider.types import Dataset

LOCOMO_CATEGORIES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop", "5": "adversarial"}

# name -> "module:function"; imported on use so that `import tider.data` stays light.
LOADERS: dict[str, str] = {
    "locomo": "tider.data.locomo:load_locomo",
    "longmemeval": "tider.data.longmemeval:load_longmemeval",
    "realmem": "tider.data.realmem:load_realmem",
    "jsonl": "tider.data.jsonl:load_jsonl",
    "synthetic": "tider.data.synth:load_synthetic",
}


def load_dataset(name: str, path: str | None = None, **options) -> Dataset:
    """Load dataset ``name`` from ``path`` (a file or a directory, depending on the format).

    ``synthetic`` with ``path=None`` generates the embedded default in memory.
    """
    if name not in LOADERS:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(LOADERS)}")
    module_name, func_name = LOADERS[name].split(":")
    loader = getattr(importlib.import_module(module_name), func_name)
    if path is None and name != "synthetic":
        raise ValueError(f"dataset {name!r} needs a path (see data/README.md)")
    return loader(path, **options)


def load_datasets(names: str, paths: str | None = None, **options) -> Dataset:
    """One dataset from several: ``names`` and ``paths`` are comma-separated and aligned
    (``"locomo,realmem"``, ``"a.json,folder/"``). Memory keys must not collide; the
    granularity must agree. Loader statistics are kept per dataset."""
    names_list = [n.strip() for n in names.split(",") if n.strip()]
    if len(names_list) == 1:
        return load_dataset(names_list[0], paths, **options)
    paths_list = [p.strip() for p in (paths or "").split(",")]
    if len(paths_list) != len(names_list):
        raise ValueError(f"datasets {names_list} need one path each, got {paths!r}")
    parts = [load_dataset(n, p or None, **options) for n, p in zip(names_list, paths_list)]
    if len({d.granularity for d in parts}) != 1:
        raise ValueError(f"datasets {names_list} have different granularities")
    memories: dict = {}
    for d in parts:
        clash = sorted(set(memories) & set(d.memories))
        if clash:
            raise ValueError(f"dataset {d.name!r}: memory keys {clash[:5]} already used by another dataset")
        memories.update(d.memories)
    queries = [q for d in parts for q in d.queries]
    stats = {d.name: d.stats for d in parts}
    stats["unresolved_evidence"] = sum(d.stats.get("unresolved_evidence", 0) for d in parts)
    return Dataset("+".join(names_list), parts[0].granularity, memories, queries, stats)


__all__ = ["LOADERS", "LOCOMO_CATEGORIES", "DatasetError", "gold_windows", "load_dataset"]
