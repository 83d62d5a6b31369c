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


__all__ = ["LOADERS", "LOCOMO_CATEGORIES", "DatasetError", "gold_windows", "load_dataset"]
