"""The GRPO rewards of fixed locator answers (one mark, a pair of marks, no window) on every
question of a split, per dataset: what a policy that always writes that answer earns.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_fixed_answers.py --model runs/lme-val/sft \
        --out bench/results/fixed_answers.json

Why: GRPO on the real-data recipes turns the greedy answer from SFT's ``H1`` (the first hit
cluster) to ``R`` (the latest relevant line) on most validation questions. If ``R`` earns
more than ``H1`` on the train split and less on validation, GRPO learned the train mix's
best constant, which does not carry to other conversations. Reads the train and validation
splits only (the same data, split and prompts as ``bench_real.py``); no model generates:
``--model`` only fixes the prompt each answer's marks resolve in.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from bench_real import parse_args as bench_args
from bench_real import scored_queries, stages
from benchlib import commit, hardware, prompted

ANSWERS = {
    "none": {"temporal": False, "windows": []},
    "H1": {"temporal": True, "windows": [{"mark": "H1"}]},
    "H2": {"temporal": True, "windows": [{"mark": "H2"}]},
    "R": {"temporal": True, "windows": [{"mark": "R"}]},
    "A": {"temporal": True, "windows": [{"mark": "A"}]},
    "H1+H2": {"temporal": True, "windows": [{"mark": "H1"}, {"mark": "H2"}]},
}


def score_split(model: str, queries, dataset, store, names, weights) -> dict:
    """Each answer's mean rewards and composite on ``queries``, per dataset and pooled."""
    from tider.data import MEMORIES_OF

    _, tables, score = prompted(model, queries, dataset, store, names, weights)
    family = {m: name for name, keys in dataset.stats.get(MEMORIES_OF, {}).items() for m in keys}
    parts = {"pooled": np.ones(len(queries), bool)}
    for name in dict.fromkeys(family.values()):
        parts[name] = np.array([family.get(q.memory_key) == name for q in queries])
    out = {}
    for label, answer in ANSWERS.items():
        scores = score([json.dumps(answer)] * len(queries), queries, tables)
        out[label] = {
            part: {"n": int(mask.sum()), **{k: round(float(v[mask].mean()), 4) for k, v in scores.items()}}
            for part, mask in parts.items()
            if mask.any()
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a tiny-real checkpoint (its prompt settings)")
    ap.add_argument("--out", default="bench/results/fixed_answers.json")
    ap.add_argument("--run", default="runs/fixed-answers", help="work folder (the LongMemEval_s sample)")
    args, rest = ap.parse_known_args(argv)
    from tider import pipeline
    from tider.data.splits import split_queries
    from tider.train.data import fixed_split

    sys.modules.setdefault("numba", None)  # as bench_real.py
    b_args = bench_args(["--split", "validation", "--out", args.run, *rest])
    steps = stages(b_args, Path(args.run))
    grpo = next(s for s in steps if getattr(s, "kind", None) == "grpo")
    g_args, g_train, _ = grpo.parse()
    run = pipeline.run(steps[:1], Path(args.run))  # the data stage only
    names, weights = list(g_args.reward_funcs), [float(w) for w in g_train.reward_weights]
    splits = split_queries(run.dataset, g_args.split_seed, **fixed_split(g_args))
    t0 = time.time()
    results = {
        split: score_split(args.model, scored_queries(splits[split]), run.dataset, run.store, names, weights)
        for split in ("train", "validation")
    }
    record = {
        "commit": commit(),
        "command": " ".join(["OMP_NUM_THREADS=2 .venv/bin/python bench/bench_fixed_answers.py", *sys.argv[1:]]),
        "hardware": hardware(),
        "rewards": dict(zip(names, weights)),
        "answers": ANSWERS,
        "results": results,
        "seconds": round(time.time() - t0),
    }
    Path(args.out).write_text(json.dumps(record, indent=1))
    for split, table in results.items():
        for label, parts in table.items():
            print(split, label, {p: (r["n"], r["composite"], r.get("evidence_advantage")) for p, r in parts.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
