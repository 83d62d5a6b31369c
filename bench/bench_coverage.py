"""Is evidence coverage cheap enough to be a GRPO reward?

Measures (window prediction -> coverage@k) evaluations per second on ONE core on a
LoCoMo-size memory: the largest LoCoMo dev conversation when the file is present, else a
synthetic memory of the same size. Predictions are random 1-3 windows inside the
memory's span (plus 15% non-temporal), like GRPO rollouts. The per-query similarity
(query embedding, BM25 and dense scores) is computed once per query and cached, as the
reward does across the G rollouts of a prompt; the "cold" figure includes it.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_coverage.py [--path ../shared/data/locomo/locomo_dev.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def random_prediction(rng: random.Random, memory):
    from tider.types import NON_TEMPORAL, Window, WindowPrediction

    if rng.random() < 0.15:
        return NON_TEMPORAL
    start, end = memory.span.start, memory.span.end
    span_days = max((end - start).days, 1)
    windows = []
    for _ in range(rng.randint(1, 3)):
        a = start + timedelta(days=rng.uniform(0, span_days))
        windows.append(Window(a, a + timedelta(days=rng.uniform(0, 14))))
    return WindowPrediction(True, tuple(sorted(windows)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--path", default=str(Path(__file__).resolve().parents[1] / ".." / "shared/data/locomo/locomo_dev.json")
    )
    parser.add_argument("--evaluations", type=int, default=20000)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from tider.data import load_dataset
    from tider.eval.retrieval import eligible_queries
    from tider.train.rewards import RewardContext
    from tider.types import Dataset

    if Path(args.path).is_file():
        full = load_dataset("locomo", args.path)
        key = max(full.memories, key=lambda k: len(full.memories[k]))
        source = f"LoCoMo dev {key}"
    else:
        full = load_dataset("synthetic")
        key = next(iter(full.memories))
        source = f"synthetic {key}"
    dataset = Dataset(
        full.name,
        full.granularity,
        {key: full.memories[key]},
        [q for q in eligible_queries(full) if q.memory_key == key],
    )
    memory = dataset.memories[key]
    ctx = RewardContext(dataset=dataset, k=args.k)  # the GRPO reward's own path (tider.memory)
    store = ctx.get_store("evidence_coverage")
    store.get(key)  # index build is per memory, once: not part of the reward cost
    store.prepare(dataset.queries)

    def coverage(q, p) -> float:
        return ctx.coverage("evidence_coverage", q.key, p, q.gold.evidence_ids)

    rng = random.Random(args.seed)
    work = [(rng.choice(dataset.queries), random_prediction(rng, memory)) for _ in range(args.evaluations)]

    t0 = time.perf_counter()
    for q in dataset.queries:  # cold: the first coverage call per query computes its similarity
        coverage(q, work[0][1])
    cold = (time.perf_counter() - t0) / len(dataset.queries)

    t0 = time.perf_counter()
    total = sum(coverage(q, p) for q, p in work)
    warm = time.perf_counter() - t0
    result = {
        "memory": source,
        "messages": len(memory),
        "queries": len(dataset.queries),
        "k": args.k,
        "evaluations": len(work),
        "evaluations_per_s": round(len(work) / warm, 1),
        "us_per_evaluation": round(1e6 * warm / len(work), 1),
        "cold_ms_per_new_query": round(1e3 * cold, 2),
        "mean_coverage": round(total / len(work), 4),
        "threads": 1,
    }
    print(json.dumps(result, indent=2))
    assert result["evaluations_per_s"] >= 1000, "coverage is too slow to serve as a GRPO reward"


if __name__ == "__main__":
    main()
