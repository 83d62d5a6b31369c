"""The real-data learning benchmark: the tiny locator trained with this stack (SFT, then GRPO,
export) on real conversations, evaluated on conversations and personas no training saw.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_real.py --out runs/bench_real

Data, read at run time: LoCoMo dev (``--locomo``, 7 conversations) and RealMem dev
(``--realmem``, 7 personas), split by conversation/persona as ``configs/sft/tiny-real.yaml``
fixes it (a seeded shuffle, seed 0, of each dataset's keys: test = the first 2 LoCoMo
conversations and the first 3 personas, validation = the next one of each, train = the
rest), and ``--longmemeval N`` LongMemEval_s dev questions (default 48 of 250: a haystack
costs ~27 s to index on a 2-core CPU the first time, then comes from the embedding cache),
sampled by question type and split a half / a fifth / the rest (``tider.data.splits.
stratified_sample``, seed 0; the sample is written to ``DIR/longmemeval_sample.json``).
Designs are chosen on ``--split validation``; the test split is read once per design: each
test run is recorded in ``bench/results/test_reads.jsonl`` (commit that file with the
results) and ``results.json`` says how often this design has read it.

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
``DIR/results.json`` gathers timings, the machine, the composite rewards and the summary;
``DIR/held_out.json`` holds stage 3's rewards and greedy completions per question.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from benchlib import ROOT, HeldOut, commit, grpo_minus_sft, hardware, matmul_ms

SHARED = ROOT.parent / "shared" / "data"
BASELINES = ("none", "rules", "top-day", "top-days", "dbscan-tuned", "timeline")
READS = ROOT / "bench" / "results" / "test_reads.jsonl"
RECIPES = ("configs/sft/tiny-real.yaml", "configs/grpo/tiny-real.yaml")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench_real")
    ap.add_argument("--data", default=str(SHARED), help="a folder with locomo/ and realmem/ (data/README.md)")
    ap.add_argument("--locomo", help="the LoCoMo file (default: DATA/locomo/locomo_dev.json, else locomo10.json)")
    ap.add_argument("--realmem", help="the RealMem folder (default: DATA/realmem)")
    ap.add_argument("--start", default=str(ROOT / "models" / "tiny-locator-v3"), help="the checkpoint SFT starts from")
    ap.add_argument("--split", default="test", choices=["validation", "test"])
    ap.add_argument("--sft-args", default="", help="extra SFT recipe overrides (experiments)")
    ap.add_argument("--grpo-args", default="", help="extra GRPO recipe overrides (experiments)")
    ap.add_argument("--held-out-samples", type=int, default=2, help="sampled completions a query for the composite")
    ap.add_argument(
        "--no-held-out",
        action="store_true",
        help="skip stage 3 (the composite reward of SFT and GRPO by local generation: the slowest stage on CPU)",
    )
    ap.add_argument("--baselines", default=",".join(BASELINES))
    ap.add_argument("--longmemeval", type=int, default=48, metavar="N", help="LongMemEval_s dev questions (0: none)")
    args = ap.parse_args(argv)
    data = Path(args.data)
    dev = data / "locomo" / "locomo_dev.json"
    args.locomo = args.locomo or str(dev if dev.exists() else data / "locomo" / "locomo10.json")
    args.realmem = args.realmem or str(data / "realmem")
    args.lme = str(data / "longmemeval" / "longmemeval_s_dev.json")
    named = [("LoCoMo", args.locomo), ("RealMem", args.realmem), ("LongMemEval_s", args.lme)]
    for what, path in named if args.longmemeval else named[:2]:
        if not Path(path).exists():
            ap.error(
                f"{what} not found at {path}: put it there (data/README.md says where each comes from) or pass --data"
            )
    return args


def data_args(args, out: Path) -> list[str]:
    """The recipes' data overrides: LoCoMo and RealMem split as the recipes fix it, plus the
    LongMemEval_s sample (written to ``out``) with its stratified split."""
    from tider.data.splits import stratified_sample

    recipe = yaml.safe_load((ROOT / RECIPES[0]).read_text())
    names, paths = ["locomo", "realmem"], [args.locomo, args.realmem]
    validation, test = list(recipe["validation_memories"]), list(recipe["test_memories"])
    if args.longmemeval:
        items = json.loads(Path(args.lme).read_text())
        split = stratified_sample({q["question_id"]: q["question_type"] for q in items}, args.longmemeval)
        chosen = {k for keys in split.values() for k in keys}
        sample = out / "longmemeval_sample.json"
        out.mkdir(parents=True, exist_ok=True)
        sample.write_text(json.dumps([q for q in items if q["question_id"] in chosen]))
        names.append("longmemeval"), paths.append(str(sample))
        validation, test = validation + split["validation"], test + split["test"]
    joined = ["--dataset_name", ",".join(names), "--dataset_path", ",".join(paths)]
    return [*joined, "--validation_memories", *validation, "--test_memories", *test]


def record_test_read(args) -> dict:
    """Append this test-split read to ``READS`` and count this design's reads (this one
    included). A design: the source tree, the two recipes, and the arguments that change
    what is trained or read."""
    git = lambda *a: subprocess.run(["git", *a], check=False, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    parts = [git("rev-parse", "HEAD:src"), git("diff", "HEAD", "--", "src")]
    parts += [(ROOT / r).read_text() for r in RECIPES]
    parts += [args.start, args.sft_args, args.grpo_args, str(args.longmemeval)]
    design = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    READS.parent.mkdir(parents=True, exist_ok=True)
    with READS.open("a") as f:
        f.write(json.dumps({"design": design, "commit": commit(), "at": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    reads = [json.loads(line) for line in READS.read_text().splitlines() if line.strip()]
    return {
        "design": design,
        "reads_of_this_design": sum(r["design"] == design for r in reads),
        "reads_all": len(reads),
    }


def scored_queries(queries) -> list:
    """The questions the held-out rewards score: with evidence, not LoCoMo's adversarial category 5."""
    return [q for q in queries if q.gold.evidence_ids and str(q.category) != "5"]


def stages(args, out: Path) -> list:
    """The benchmark's pipeline: the tiny-real recipes on the real data, in this process."""
    from tider.data.splits import split_queries
    from tider.eval.compare import CompareConfig
    from tider.pipeline import Compare, Export, RecipeData, Train
    from tider.train.data import fixed_split

    data = [*data_args(args, out), "--report_to", "none", "--save_strategy", "no"]  # once: it reads 129 MB

    def train(kind: str, start: str, extra: str) -> Train:
        return Train(kind, ROOT / f"configs/{kind}/tiny-real.yaml", out / kind, start, [*data, *extra.split()])

    sft, grpo = train("sft", args.start, args.sft_args), train("grpo", str(out / "sft"), args.grpo_args)
    g_args, g_train, _ = grpo.parse()

    def split(run) -> list:
        return split_queries(run.dataset, g_args.split_seed, **fixed_split(g_args))[args.split]

    def scored(run) -> list:
        return scored_queries(split(run))

    names, weights = list(g_args.reward_funcs), [float(w) for w in g_train.reward_weights]
    labelled = [("sft", sft.folder), ("grpo", grpo.folder)]
    baselines = tuple(b for b in args.baselines.split(",") if b)
    held_out = (
        []
        if args.no_held_out
        else [HeldOut(scored, labelled, names, weights, args.held_out_samples, g_train.temperature)]
    )
    return [
        RecipeData(sft),
        sft,
        grpo,
        *held_out,
        Export("float32"),
        Compare(
            CompareConfig(baselines=baselines),
            memory_keys=lambda run: sorted({q.memory_key for q in split(run)}),
            progress=False,
        ),
    ]


def composite(held_out: dict) -> dict:
    """Composite reward of SFT and GRPO, greedy and sampled, with the paired bootstrap of GRPO - SFT."""
    rows, names = held_out["rows"], held_out["names"]
    mean = lambda stage, key: float(np.mean([r[key] for r in rows[stage]]))
    result = {
        "greedy": {
            **{s: mean(s, "composite") for s in rows},
            **{f"{s}/{n}": mean(s, f"r/{n}") for s in rows for n in names},
            "grpo_minus_sft": grpo_minus_sft(rows),
        }
    }
    if "sampled/composite" in rows["sft"][0]:
        result["sampled"] = {
            **{s: mean(s, "sampled/composite") for s in rows},
            **{f"{s}/{n}": mean(s, f"sampled/{n}") for s in rows for n in names},
            "grpo_minus_sft": grpo_minus_sft(rows, "sampled/composite"),
        }
    return result


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

    from tider import pipeline

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    os.environ.setdefault("WANDB_MODE", "disabled")
    # As tider.train.grpo.prepare_vllm_colocate_on_cpu: GRPO's colocated vLLM engine runs in
    # this process and cannot start once numba is loaded; with it hidden, bm25s uses numpy.
    sys.modules.setdefault("numba", None)
    out = Path(args.out)
    # A skipped stage keeps the time of the run that did the work (DIR/timings.json).
    timings = json.loads((out / "timings.json").read_text()) if (out / "timings.json").exists() else {}
    t_start = time.time()
    reads = record_test_read(args) if args.split == "test" else None
    run = pipeline.run(stages(args, out), out)
    timings.update({f"{k}_s": v for k, v in run.times.items() if k not in run.skipped})
    comparison = run.results["compare"]
    (out / "compare.json").write_text(json.dumps(comparison, indent=2))
    (out / "compare.md").write_text((out / "compare" / "compare.md").read_text())
    timings["this_run_s"] = time.time() - t_start
    timings["total_s"] = sum(v for k, v in timings.items() if k not in ("total_s", "this_run_s"))
    (out / "timings.json").write_text(json.dumps(timings, indent=1))
    results = {
        "commit": commit(),
        "command": " ".join(["OMP_NUM_THREADS=2 .venv/bin/python bench/bench_real.py", *sys.argv[1:]]),
        "hardware": hardware(),
        "float32_matmul_ms": matmul_ms(),
        "split": args.split,
        "test_reads": reads,
        "longmemeval_questions": args.longmemeval,
        "argv": sys.argv[1:],
        "composite": composite(run.results["held_out"]) if "held_out" in run.results else None,
        "summary": summary(comparison),
        "timings_s": timings,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    if "held_out" in run.results:  # per question (its key) and stage: the rewards, the greedy completion
        kept = {k: v for k, v in run.results["held_out"].items() if k != "queries"}
        (out / "held_out.json").write_text(json.dumps(kept, indent=1))
    print(json.dumps({k: results[k] for k in ("composite", "timings_s")}, indent=1))
    print((out / "compare.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
