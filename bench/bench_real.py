"""The real-data learning benchmark: the tiny locator trained with this stack (SFT, then GRPO,
export) on real conversations, evaluated on conversations and personas no training saw.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_real.py --out runs/bench_real

Data, read at run time: LoCoMo dev (``--locomo``, 7 conversations) and RealMem dev
(``--realmem``, 7 personas), split by conversation/persona as ``configs/sft/tiny-real.yaml``
fixes it (a seeded shuffle, seed 0, of each dataset's keys: test = the first 2 LoCoMo
conversations and the first 3 personas, validation = the next one of each, train = the
rest). Designs are chosen on ``--split validation``; the test split is run once.

Stages (each skipped when its output exists, so an interrupted run resumes):
1. SFT: ``configs/sft/tiny-real.yaml`` from ``--start`` (default the shipped
   ``models/tiny-locator-v3``, made from synthetic and RealMem train data only);
2. GRPO: ``configs/grpo/tiny-real.yaml`` from the SFT checkpoint;
3. held-out composite reward of SFT and GRPO on the evaluated split, greedy and sampled,
   with a paired bootstrap of GRPO - SFT (as ``bench_learning.py``);
4. ``DIR/export``: ``tider export`` of the GRPO checkpoint (float32, verified by reload);
5. ``DIR/compare.json``: ``tider eval compare``'s own ``run_compare`` on the split, the
   export as the locator against ``none``, ``rules``, ``top-day``, ``dbscan-tuned``,
   ``timeline`` and ``oracle`` through the same retriever: the pooled table, exact McNemar
   on hit_all@20, and a table per dataset.
``DIR/results.json`` gathers timings, the machine, the composite rewards and the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchlib import ROOT, hardware, matmul_ms, paired_bootstrap_ci, recipe_args

SHARED = ROOT.parent / "shared" / "data"
BASELINES = ("none", "rules", "top-day", "top-days", "dbscan-tuned", "timeline")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench_real")
    ap.add_argument("--locomo", default=str(SHARED / "locomo" / "locomo_dev.json"))
    ap.add_argument("--realmem", default=str(SHARED / "realmem"))
    ap.add_argument("--start", default=str(ROOT / "models" / "tiny-locator-v3"), help="the checkpoint SFT starts from")
    ap.add_argument("--split", default="test", choices=["validation", "test"])
    ap.add_argument("--sft-args", default="", help="extra SFT recipe overrides (experiments)")
    ap.add_argument("--grpo-args", default="", help="extra GRPO recipe overrides (experiments)")
    ap.add_argument("--held-out-samples", type=int, default=2, help="sampled completions a query for the composite")
    ap.add_argument("--baselines", default=",".join(BASELINES))
    return ap.parse_args(argv)


def overrides(args, stage: str, model: str, out: Path) -> list[str]:
    extra = args.sft_args if stage == "sft" else args.grpo_args
    return [
        "--model_name_or_path",
        model,
        "--output_dir",
        str(out / stage),
        "--dataset_path",
        f"{args.locomo},{args.realmem}",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        *extra.split(),
    ]


def train(args, out: Path, timings: dict):
    """SFT then GRPO, each skipped when its checkpoint exists; returns the GRPO recipe's arguments."""
    from tider.memory.collection import MemoryCollection
    from tider.train.data import load_training_dataset
    from tider.train.grpo import run_grpo
    from tider.train.sft import run_sft

    s_args, s_train, s_model = recipe_args("sft/tiny-real", overrides(args, "sft", args.start, out))
    t0 = time.time()
    dataset = load_training_dataset(s_args)
    store = MemoryCollection(dataset.memories)
    timings["data_s"] = time.time() - t0
    if not (out / "sft" / "tider_locator.json").exists():
        t0 = time.time()
        run_sft(s_args, s_train, s_model, dataset=dataset, store=store)
        record(out, timings, "sft_s", time.time() - t0)
    g = recipe_args("grpo/tiny-real", overrides(args, "grpo", str(out / "sft"), out))
    if not (out / "grpo" / "tider_locator.json").exists():
        t0 = time.time()
        run_grpo(*g, dataset=dataset, store=store)
        record(out, timings, "grpo_s", time.time() - t0)
    return g, dataset, store


def record(out: Path, timings: dict, stage: str, seconds: float) -> None:
    """A finished stage's time, kept in DIR/timings.json so that a resumed run reports the
    time of the run that did the work, not the skip."""
    timings[stage] = seconds
    (out / "timings.json").write_text(json.dumps(timings, indent=1))


def held_out(args, out: Path, grpo, dataset, store, queries) -> dict:
    """Composite reward of SFT and GRPO on ``queries``, greedy and sampled, with the paired
    bootstrap of GRPO - SFT."""
    from benchlib import held_out_rewards, sampled_rewards

    g_args, g_train, _ = grpo
    names, weights = list(g_args.reward_funcs), [float(w) for w in g_train.reward_weights]
    result = {}
    greedy = {
        stage: held_out_rewards(out / stage, queries, dataset, store, names, weights)[0] for stage in ("sft", "grpo")
    }
    diffs = [b["composite"] - a["composite"] for a, b in zip(greedy["sft"], greedy["grpo"])]
    result["greedy"] = {
        **{stage: sum(r["composite"] for r in rows) / len(rows) for stage, rows in greedy.items()},
        "grpo_minus_sft": paired_bootstrap_ci(diffs),
    }
    if args.held_out_samples:
        sampled = {
            stage: sampled_rewards(
                out / stage, queries, dataset, store, names, weights, args.held_out_samples, g_train.temperature
            )
            for stage in ("sft", "grpo")
        }
        result["sampled"] = {
            **{stage: float(r["composite"].mean()) for stage, r in sampled.items()},
            **{f"{stage}/{name}": float(sampled[stage][name].mean()) for stage in sampled for name in names},
            "grpo_minus_sft": paired_bootstrap_ci(sampled["grpo"]["composite"] - sampled["sft"]["composite"]),
        }
    return result


def export(out: Path) -> None:
    from tider.cli import main as cli

    if not (out / "export" / "tider_locator.json").exists():
        code = cli(["export", "--checkpoint", str(out / "grpo"), "--out", str(out / "export"), "--dtype", "float32"])
        if code != 0:
            raise SystemExit(f"tider export failed ({code}); see {out / 'export'}")


def compare(args, out: Path, dataset, memory_keys) -> dict:
    from tider.eval.compare import CompareConfig, run_compare

    config = CompareConfig(
        baselines=tuple(b for b in args.baselines.split(",") if b),
        source_options={"locator": {"model": str(out / "export")}},
        memory_keys=memory_keys,
    )
    return run_compare(dataset, config, out / "compare", progress=False)


def summary(comparison: dict) -> dict:
    rows = {"pooled": comparison, **comparison.get("per_dataset", {})}
    return {
        name: {
            "n_queries": c["n_queries"],
            "recall@20": {m: row["recall@20"] for m, row in c["table"].items()},
            "hit_all@20": {m: row["hit_all@20"] for m, row in c["table"].items()},
            "parse_fail": c["table"]["locator"].get("parse_fail"),
            "mcnemar": c["mcnemar"]["locator_vs"],
        }
        for name, c in rows.items()
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    os.environ.setdefault("WANDB_MODE", "disabled")
    # As tider.train.grpo.prepare_vllm_colocate_on_cpu: GRPO's colocated vLLM engine runs in
    # this process and cannot start once numba is loaded; with it hidden, bm25s uses numpy.
    sys.modules.setdefault("numba", None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timings = json.loads((out / "timings.json").read_text()) if (out / "timings.json").exists() else {}
    t_start = time.time()
    grpo, dataset, store = train(args, out, timings)
    from tider.train.data import fixed_split
    from tider.train.examples import split_queries

    splits = split_queries(dataset, grpo[0].split_seed, **fixed_split(grpo[0]))
    queries = [q for q in splits[args.split] if q.gold.evidence_ids and str(q.category) != "5"]
    t0 = time.time()
    composite = held_out(args, out, grpo, dataset, store, queries)
    timings["held_out_s"] = time.time() - t0
    t0 = time.time()
    export(out)
    timings["export_s"] = time.time() - t0
    t0 = time.time()
    comparison = compare(args, out, dataset, sorted({q.memory_key for q in splits[args.split]}))
    timings["compare_s"] = time.time() - t0
    (out / "compare.json").write_text(json.dumps(comparison, indent=2))
    (out / "compare.md").write_text((out / "compare" / "compare.md").read_text())
    timings["this_run_s"] = time.time() - t_start
    timings["total_s"] = sum(v for k, v in timings.items() if k not in ("total_s", "this_run_s"))
    results = {
        "hardware": hardware(),
        "float32_matmul_ms": matmul_ms(),
        "split": args.split,
        "argv": sys.argv[1:],
        "composite": composite,
        "summary": summary(comparison),
        "timings_s": timings,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: results[k] for k in ("composite", "timings_s")}, indent=1))
    print((out / "compare.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
