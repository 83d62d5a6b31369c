"""What GRPO could find, and what it found, on the learning benchmark's VALIDATION split
(model selection happens here; the test split is kept for the claim).

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_grpo_headroom.py runs/bench_learning/sft-answer \
        runs/bench_learning/grpo [more GRPO checkpoints] --out runs/grpo_headroom.json

1. Greedy held-out composite of every checkpoint (the GRPO rewards with the recipe's
   weights, as ``bench_learning.py`` scores the test split), paired bootstrap of each
   against the first.
   ``sft_targets``: the same composite of SFT's targets in the first's prompts (its ceiling).
2. Headroom of the first (the SFT start): on ``--headroom-prompts`` validation prompts,
   ``--samples`` completions at the GRPO temperature. GRPO raises the *sampled* reward;
   serving is greedy, so what it can gain there is bounded by how often a sample beats
   the greedy answer (best-of-k minus greedy).
3. ``--policy-samples N``: every checkpoint's sampled composite (N samples a prompt at the
   GRPO temperature), the policy's expected reward, bootstrapped against the first.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from benchlib import benchmark_split, held_out_rewards, paired_bootstrap_ci, prompted, sampled_rewards


def headroom(model: str, queries, dataset, store, names, weights, samples: int, temperature: float) -> dict:
    source, tables, score = prompted(model, queries, dataset, store, names, weights)
    backend = source.client.backend
    greedy = score(
        [c.text for c in backend.generate_batch([t.messages for t in tables], max_tokens=64, temperature=0.0)],
        queries,
        tables,
    )["composite"]
    rep = [t for t in tables for _ in range(samples)]
    drawn = backend.generate_batch([t.messages for t in rep], max_tokens=64, temperature=temperature, seed=1)
    sampled = score([c.text for c in drawn], [q for q in queries for _ in range(samples)], rep)["composite"]
    sampled = sampled.reshape(len(queries), samples)
    by = defaultdict(list)
    for q, g, s in zip(queries, greedy, sampled):
        by[q.category].append([g, s.mean(), s.max()])
    return {
        "prompts": len(queries),
        "samples": samples,
        "temperature": temperature,
        "greedy": float(greedy.mean()),
        "sample_mean": float(sampled.mean()),
        "best_of_k": float(sampled.max(1).mean()),
        "share_with_spread": float((sampled.max(1) > sampled.min(1)).mean()),
        "share_a_sample_beats_greedy": float((sampled.max(1) > greedy + 1e-9).mean()),
        "by_category_greedy_mean_best": {k: np.mean(v, axis=0).round(3).tolist() for k, v in sorted(by.items())},
    }


def target_composite(model: str, queries, dataset, store, names, weights) -> float:
    """The composite of SFT's own targets (``tider.train.examples.PromptBuilder.target``) in
    ``model``'s prompts: what imitating them perfectly would score, the ceiling SFT aims at."""
    from tider.train.examples import PromptBuilder

    _, tables, score = prompted(model, queries, dataset, store, names, weights)
    builder = PromptBuilder(dataset, store)
    texts = [json.dumps(builder.target(q, t)) for q, t in zip(queries, tables)]
    return float(score(texts, queries, tables)["composite"].mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoints", nargs="+", help="the SFT start first, then GRPO checkpoints")
    ap.add_argument("--out", default="runs/grpo_headroom.json")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--headroom-prompts", type=int, default=96, help="0 = skip the headroom part")
    ap.add_argument(
        "--policy-samples",
        type=int,
        default=0,
        help="also each checkpoint's sampled composite (this many samples per prompt at the GRPO "
        "temperature: the expected reward GRPO maximizes), bootstrapped against the first",
    )
    args = ap.parse_args(argv)
    g_args, g_train, dataset, store, splits = benchmark_split(args.checkpoints[0])  # the benchmark's defaults
    val, names, weights = splits["validation"], g_args.reward_funcs, g_train.reward_weights
    rows = {c: held_out_rewards(Path(c), val, dataset, store, names, weights)[0] for c in args.checkpoints}
    start = [r["composite"] for r in rows[args.checkpoints[0]]]
    result = {
        "split": "validation",
        "n": len(val),
        "composite": {
            c: {
                "mean": float(np.mean([r["composite"] for r in rs])),
                "vs_first": paired_bootstrap_ci([r["composite"] - s for r, s in zip(rs, start)]) if i else None,
            }
            for i, (c, rs) in enumerate(rows.items())
        },
        "sft_targets": target_composite(args.checkpoints[0], val, dataset, store, names, weights),
    }
    if args.policy_samples:
        samples, temperature = args.policy_samples, g_train.temperature
        means = {
            c: sampled_rewards(Path(c), val, dataset, store, names, weights, samples, temperature)["composite"]
            for c in args.checkpoints
        }
        first = means[args.checkpoints[0]]
        result["sampled"] = {
            "samples": args.policy_samples,
            "temperature": g_train.temperature,
            "composite": {
                c: {"mean": float(m.mean()), "vs_first": paired_bootstrap_ci(m - first) if i else None}
                for i, (c, m) in enumerate(means.items())
            },
        }
    if args.headroom_prompts:
        picked = np.random.default_rng(0).choice(len(val), size=min(args.headroom_prompts, len(val)), replace=False)
        result["headroom"] = headroom(
            args.checkpoints[0],
            [val[i] for i in picked],
            dataset,
            store,
            names,
            weights,
            args.samples,
            g_train.temperature,
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
