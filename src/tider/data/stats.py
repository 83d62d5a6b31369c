"""Dataset statistics: the numbers `tider data stats` prints (and tests assert)."""

from __future__ import annotations

from collections import Counter

from tider.types import WINDOW_BUCKETS, Dataset, window_bucket


def _category_order(name: str):
    # Numeric categories (LoCoMo "1".."5") sort as numbers, names alphabetically after.
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def dataset_stats(dataset: Dataset) -> dict:
    """Counts over a loaded dataset; loader-specific counts come from ``dataset.stats``."""
    by_category = Counter(q.category if q.category is not None else "none" for q in dataset.queries)
    by_bucket = Counter(window_bucket(len(q.gold.windows)) for q in dataset.queries)
    extra = {k: v for k, v in dataset.stats.items() if k != "unresolved_evidence"}
    return {
        "dataset": dataset.name,
        "granularity": dataset.granularity,
        "conversations": len(dataset.memories),
        "sessions": sum(len(m.sessions) for m in dataset.memories.values()),
        "messages": sum(len(m) for m in dataset.memories.values()),
        "queries": len(dataset.queries),
        "by_category": {k: by_category[k] for k in sorted(by_category, key=_category_order)},
        "by_window_bucket": {b: by_bucket.get(b, 0) for b in WINDOW_BUCKETS},
        "temporal_queries": sum(q.gold.temporal for q in dataset.queries),
        "unresolved_evidence": sum(len(q.gold.unresolved_evidence) for q in dataset.queries),
        "loader": extra,
    }
