"""Deterministic train / validation / test splits by memory (conversation).

Splits are by memory, never by query: every query of a memory lands in the same split, so
no message seen while training ever backs a held-out question. The split is a seeded
shuffle of the sorted keys, so it depends only on the set of keys and the seed (LoCoMo dev
conversations are split by exactly the same function). Training, evaluation and the
benchmarks all split here.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from tider.types import Dataset, Query

SPLITS = ("train", "validation", "test")


def split_keys(
    memory_keys: Iterable[str],
    seed: int = 0,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    validation: Sequence[str] = (),
    test: Sequence[str] = (),
) -> dict[str, list[str]]:
    """Deterministic train/validation/test split of memory keys.

    ``validation``/``test`` given: a fixed split, those memories there and every other one
    in train. Otherwise a seeded shuffle cut by ``fractions``; with three or more keys every
    split gets at least one, so small benchmarks (a handful of LoCoMo conversations) still
    have a held-out memory.
    """
    keys = sorted(set(memory_keys))
    if validation or test:
        missing = sorted((set(validation) | set(test)) - set(keys))
        if missing or set(validation) & set(test):
            raise ValueError(
                f"fixed split: memories {missing} are not in the data, or a memory is in both "
                f"validation {sorted(validation)} and test {sorted(test)}"
            )
        held = set(validation) | set(test)
        return {"train": [k for k in keys if k not in held], "validation": sorted(validation), "test": sorted(test)}
    if len(fractions) != 3 or abs(sum(fractions) - 1.0) > 1e-6 or min(fractions) < 0:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    random.Random(seed).shuffle(keys)
    n = len(keys)
    n_val = round(n * fractions[1])
    n_test = round(n * fractions[2])
    if n >= 3:
        n_val, n_test = max(1, n_val), max(1, n_test)
    n_train = n - n_val - n_test
    return {
        "train": sorted(keys[:n_train]),
        "validation": sorted(keys[n_train : n_train + n_val]),
        "test": sorted(keys[n_train + n_val :]),
    }


def stratified_sample(
    strata: dict[str, str], n: int, seed: int = 0, fractions: Sequence[float] = (0.5, 0.2, 0.3)
) -> dict[str, list[str]]:
    """``n`` of the memories ``strata`` maps to a stratum (e.g. LongMemEval's question type),
    split train/validation/test by ``fractions``: each stratum gets its share of ``n`` and of
    each split (largest remainders), drawn by a seeded shuffle of its sorted keys. For datasets
    too costly to run whole (a LongMemEval_s haystack takes ~27 s to index on a 2-core CPU):
    every question type stays in every split, in proportion."""
    by: dict[str, list[str]] = {}
    for key in sorted(strata):
        by.setdefault(strata[key], []).append(key)
    if not 0 < n <= len(strata):
        raise ValueError(f"stratified sample: n must be in 1..{len(strata)}, got {n}")
    take = _apportion({s: len(keys) * n / len(strata) for s, keys in sorted(by.items())}, n)
    out: dict[str, list[str]] = {name: [] for name in SPLITS}
    rng = random.Random(seed)
    for stratum, keys in sorted(by.items()):
        rng.shuffle(keys)
        chosen = keys[: take[stratum]]
        share = _apportion({name: f * len(chosen) for name, f in zip(SPLITS, fractions)}, len(chosen))
        at = 0
        for name in SPLITS:
            out[name] += chosen[at : at + share[name]]
            at += share[name]
    return {name: sorted(keys) for name, keys in out.items()}


def _apportion(quotas: dict[str, float], total: int) -> dict[str, int]:
    """Integers that sum to ``total``, each its quota's floor plus one for the largest remainders."""
    out = {k: int(q) for k, q in quotas.items()}
    for k in sorted(quotas, key=lambda k: (out[k] - quotas[k], k))[: total - sum(out.values())]:
        out[k] += 1
    return out


SPLIT_CHOICES = ("train", "validation", "test", "heldout", "all")


def memory_keys_of(memory_keys: Iterable[str], split: str, seed: int = 0, **fixed) -> list[str] | None:
    """The memories of a named split; ``heldout`` = validation + test (every conversation
    training never saw), ``all`` = None (no restriction). ``fixed``: ``validation=``/``test=``
    lists of a fixed split (``split_keys``)."""
    if split == "all":
        return None
    if split not in SPLIT_CHOICES:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLIT_CHOICES)}")
    splits = split_keys(memory_keys, seed=seed, **fixed)
    return sorted(splits["validation"] + splits["test"]) if split == "heldout" else splits[split]


TRAIN_ONLY = "train_only_memories"  # Dataset.stats key: memories added for training only


def split_queries(dataset: Dataset, seed: int = 0, fractions=(0.8, 0.1, 0.1), **fixed) -> dict[str, list[Query]]:
    """The dataset's queries, grouped by the split of their memory. Memories listed in
    ``dataset.stats["train_only_memories"]`` (extra training conversations) all go to
    train; the others are split by ``split_keys`` (``fixed``: its ``validation``/``test``
    lists), exactly as without the extras."""
    train_only = set(dataset.stats.get(TRAIN_ONLY, ()))
    splits = split_keys([k for k in dataset.memories if k not in train_only], seed, fractions, **fixed)
    splits["train"] = sorted(set(splits["train"]) | train_only)
    where = {key: name for name, keys in splits.items() for key in keys}
    out: dict[str, list[Query]] = {name: [] for name in SPLITS}
    for q in dataset.queries:
        if q.memory_key not in where:
            raise ValueError(f"dataset {dataset.name!r}: query {q.key!r} names unknown memory {q.memory_key!r}")
        out[where[q.memory_key]].append(q)
    return out
