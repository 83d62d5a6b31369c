"""Levers on real conversations, scored on the validation split: one row per locator
checkpoint (what each training stage adds) and per learning-free source, under the shipped
retriever. Columns: recall@20, hit_all@20, window IoU, parse failures, and the regret (the
recall lost, per question, on the questions where ``none`` had all their evidence in the top 20).

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_real_levers.py --run runs/bench_real --out runs/bench_real_levers

``--run`` is a finished ``bench/bench_real.py`` directory (its ``sft/`` and ``grpo/``);
the rows are the shipped start (``models/tiny-locator-v3``, no real training), that start
after SFT on the real train split, and after GRPO, answering greedily and by a vote of 8
sampled completions that keeps the windows at least 1-4 of them name (the recipe's
decoding is the vote with min 1). Writes ``DIR/levers.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchlib import ROOT, hardware

SHARED = ROOT.parent / "shared" / "data"
VALIDATION = ("conv-30", "Adeleke_Okonjo")  # configs/sft/tiny-real.yaml's validation_memories
BASELINES = ("none", "rules", "top-day", "top-days", "timeline")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/bench_real", help="a bench_real.py output directory")
    ap.add_argument("--out", default="runs/bench_real_levers")
    ap.add_argument("--locomo", default=str(SHARED / "locomo" / "locomo_dev.json"))
    ap.add_argument("--realmem", default=str(SHARED / "realmem"))
    ap.add_argument("--memories", default=",".join(VALIDATION))
    return ap.parse_args(argv)


def records(run_dir: Path, method: str) -> dict[str, dict]:
    path = run_dir / "retrieval" / f"retrieve-{method}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["key"]: r["record"] for r in rows if r["status"] == "ok"}


def regret(none: dict[str, dict], other: dict[str, dict]) -> float:
    """Mean recall@20 lost on the questions ``none`` answered fully."""
    solved = [k for k, r in none.items() if r["all@20"] == 1 and k in other]
    lost = [1.0 - other[k]["hits@20"] / other[k]["n_gold"] for k in solved]
    return sum(lost) / len(lost) if lost else 0.0


def row(run_dir: Path, method: str, table: dict, none: dict) -> dict:
    r = table[method]
    return {
        "recall@20": r["recall@20"],
        "hit_all@20": r["hit_all@20"],
        "window_iou": r["window_iou"],
        "parse_fail": r.get("parse_fail"),
        "regret": regret(none, records(run_dir, method)),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    from tider.data import load_datasets
    from tider.eval.compare import CompareConfig, run_compare

    out = Path(args.out)
    dataset = load_datasets("locomo,realmem", f"{args.locomo},{args.realmem}")
    keys = [k for k in args.memories.split(",") if k]
    grpo = Path(args.run) / "grpo"
    vote = {"samples": 8, "temperature": 1.0}
    # (checkpoint, decoding): None is the one its tider_locator.json records; the vote rows
    # share one cache, so they draw the same 8 samples a question and differ only in the count.
    levers = {
        "start (models/tiny-locator-v3)": (ROOT / "models" / "tiny-locator-v3", None),
        "+ SFT on real train": (Path(args.run) / "sft", None),
        "+ GRPO, greedy answer": (grpo, {}),
        **{f"+ GRPO, vote of 8, min {k}": (grpo, {**vote, "min_votes": k}) for k in (1, 2, 3, 4)},
    }
    rows, n = {}, None
    for i, (name, (ckpt, decoding)) in enumerate(levers.items()):
        run_dir = out / f"locator-{i}"
        options = {"model": str(ckpt), "cache_path": str(out / "llm_cache.sqlite")}
        config = CompareConfig(
            baselines=BASELINES if i == 0 else ("none",),
            source_options={"locator": options if decoding is None else {**options, "decoding": decoding}},
            memory_keys=keys,
            oracle=i == 0,
        )
        table = run_compare(dataset, config, run_dir, progress=False)
        n = table["n_queries"]
        none = records(run_dir, "none")
        if i == 0:
            rows.update({m: row(run_dir, m, table["table"], none) for m in (*BASELINES, "oracle")})
        rows[name] = row(run_dir, "locator", table["table"], none)
    result = {"hardware": hardware(), "memories": keys, "n_queries": n, "rows": rows}
    (out / "levers.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# Levers on the validation split ({', '.join(keys)}; {n} queries)",
        "",
        "| row | recall@20 | hit_all@20 | window IoU | parse fail | regret |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        cells = [r["recall@20"], r["hit_all@20"], r["window_iou"], r["parse_fail"], r["regret"]]
        lines.append(f"| {name} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    (out / "levers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
