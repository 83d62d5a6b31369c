"""The retrieval floor per dataset: `tider eval retrieval --windows none,rules,top-days` on
every question of LoCoMo dev, RealMem dev and LongMemEval_s dev, with the seconds each
memory (a conversation, a persona, a question's haystack) took to index.

    .venv/bin/python bench/bench_floor.py [--data ../shared/data] [--runs runs/floor]

Each dataset runs as the CLI, in its own process, into a fresh folder (so every memory is
indexed in that process and timed); the embeddings come from the embedder's cache
(`.cache/tider/embeddings`) when an earlier run filled it, else from MiniLM, which is the
slow part (LongMemEval_s: ~26 s per haystack on one 2-core EPYC; a cached one ~0.5 s). The
results go to `bench/results/retrieval_floor.json` (a run of some `--sets` replaces their
rows and keeps the others'), which `scripts/results_tables.py` turns into the README's floor
table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchlib import commit, hardware, load

ROOT = Path(__file__).resolve().parents[1]
SETS = {  # name: (--dataset, path under --data)
    "locomo": ("locomo", "locomo/locomo_dev.json"),
    "realmem": ("realmem", "realmem"),
    "longmemeval": ("longmemeval", "longmemeval/longmemeval_s_dev.json"),
}
WINDOWS = ("none", "rules", "top-days")


def run_set(name: str, data: Path, runs: Path) -> dict:
    dataset, rel = SETS[name]
    out = runs / name
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "tider.cli", "eval", "retrieval", "--dataset", dataset]
    command += ["--path", str(data / rel), "--windows", ",".join(WINDOWS), "--out", str(out)]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    wall = time.perf_counter() - start
    report = json.loads((out / "report.json").read_text())
    methods = report["methods"]
    return {
        "n_queries": report["n_queries"],
        "recall@20": {m: methods[m]["recall@20"] for m in WINDOWS},
        "hit_all@20": {m: methods[m]["hit_all@20"] for m in WINDOWS},
        "index_build_s": report["index_build_s"],
        "wall_s": round(wall, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="the layout `tider data get` writes")
    p.add_argument("--runs", default="runs/floor")
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--out", default="bench/results/retrieval_floor.json")
    args = p.parse_args()
    data = Path(args.data)
    if not data.exists():
        sys.exit(f"no data at {data}: run `tider data get locomo --out {data}` (and realmem, longmemeval)")
    out = Path(args.out)
    # a run of some sets keeps the others' rows (each row says when and where it ran)
    results = json.loads(out.read_text()) if out.exists() else {"sets": {}}
    for name in args.sets.split(","):
        row = run_set(name, data, Path(args.runs))
        results["sets"][name] = {**row, "commit": commit(), "load_1min": load()}
    results.update(commit=commit(), command="bench/bench_floor.py " + " ".join(sys.argv[1:]), hardware=hardware())
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
