"""Choose ``dbscan-tuned`` (and the ``timeline`` source's top_m) on dev data only.

Grid over the T-Mem rule's knobs plus ``max_windows`` (keep only the densest clusters),
scored by evidence recall@20 (then all-evidence hit@20) through the default
dual-channel retriever, among settings that emit windows for at least half the queries
(``--min-temporal-rate``; a setting that almost never fires is just ``none`` again, and
the unconstrained best is reported too), on the NON-TEST conversations of the dev file
(``tider.train.examples.split_keys``: train + validation); the test conversations are
never looked at. The winner is printed; copy it into ``TUNED`` in
``src/tider/locator/dbscan.py`` (the values there cite this script).

    OMP_NUM_THREADS=1 .venv/bin/python bench/sweep_dbscan.py --path ../shared/data/locomo/locomo_dev.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from dataclasses import asdict, replace

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="locomo")
    parser.add_argument("--path", default="../shared/data/locomo/locomo_dev.json")
    parser.add_argument("--out", default="runs/sweep_dbscan.json")
    parser.add_argument("--min-temporal-rate", type=float, default=0.5)
    args = parser.parse_args()

    from tqdm.auto import tqdm

    from tider.data import load_dataset
    from tider.eval.retrieval import eligible_queries, quick_eval
    from tider.locator.dbscan import PAPER, DBSCANWindows
    from tider.locator.sources import make_source
    from tider.memory import MemoryCollection
    from tider.train.examples import split_keys

    dataset = load_dataset(args.dataset, args.path)
    splits = split_keys(dataset.memories)
    tune_keys = splits["train"] + splits["validation"]
    queries = eligible_queries(dataset, memory_keys=tune_keys)
    store = MemoryCollection(dataset.memories)
    store.prepare(queries)
    print(f"tuning on {len(queries)} queries of {tune_keys} (test conversations {splits['test']} held out)")

    baseline = quick_eval(store, make_source("none"), queries)
    rows = []
    grid = itertools.product(
        [0.5, 1.0, 3.0, 7.0],
        [None, 1, 2, 3],
        [0.0, PAPER.pad_days, 1.0],
        [PAPER.delta_days, 1.0],
        [PAPER.mu_per_day, 0.25],
    )
    for eps, max_w, pad, delta, mu in tqdm(list(grid), desc="dbscan grid"):
        cfg = replace(PAPER, eps_days=eps, max_windows=max_w, pad_days=pad, delta_days=delta, mu_per_day=mu)
        agg = quick_eval(store, DBSCANWindows(store, cfg, "sweep"), queries)
        rows.append(
            {
                "config": asdict(cfg),
                "recall@20": agg["recall@20"],
                "hit_all@20": agg["hit_all@20"],
                "windows_per_query": agg["windows_per_query"],
                "temporal_rate": agg["temporal_rate"],
            }
        )
    rows.sort(key=lambda r: (-r["recall@20"], -r["hit_all@20"]))
    firing = [r for r in rows if r["temporal_rate"] >= args.min_temporal_rate]

    timeline_rows = []
    for theta in (0.85, 0.5, 0.35, 0.2):
        tstore = MemoryCollection(
            dataset.memories,
            replace(store.config, timeline=replace(store.config.timeline, theta_sem=theta)),
            embedder=store.embedder,
        )
        sizes = [len(tstore.timeline(k)) for k in tune_keys]
        for top_m in (1, 3, 5, 10):
            agg = quick_eval(tstore, make_source("timeline", top_m=top_m), queries)
            timeline_rows.append(
                {
                    "theta_sem": theta,
                    "entries_per_memory": sum(sizes) / len(sizes),
                    "top_m": top_m,
                    "recall@20": agg["recall@20"],
                    "hit_all@20": agg["hit_all@20"],
                }
            )
    timeline_rows.sort(key=lambda r: (-r["recall@20"], -r["hit_all@20"]))
    result = {
        "tune_memories": tune_keys,
        "held_out": splits["test"],
        "n_queries": len(queries),
        "none": {"recall@20": baseline["recall@20"], "hit_all@20": baseline["hit_all@20"]},
        "paper": next(r for r in rows if r["config"] == asdict(PAPER)),
        "best": firing[0] if firing else None,
        "best_unconstrained": rows[0],
        "top10": firing[:10],
        "timeline": timeline_rows,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({**result, "all": rows}, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
