"""Benchmark `tider data synth`: wall time at 100k messages, and byte-identical reruns.

    .venv/bin/python bench/bench_synth.py [--messages 100000] [--seed 1] [--budget-s 60]

Runs the real CLI twice in fresh processes (so the time includes start-up and writing),
hashes every output file, and exits non-zero if the two runs differ or either run is
slower than the budget.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def digest(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def run_once(out: Path, messages: int, seed: int) -> float:
    command = [
        sys.executable,
        "-m",
        "tider.cli",
        "data",
        "synth",
        "--out",
        str(out),
        "--messages",
        str(messages),
        "--seed",
        str(seed),
    ]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--budget-s", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for name in ("run1", "run2"):
            out = Path(tmp) / name
            seconds = run_once(out, args.messages, args.seed)
            runs.append(
                {
                    "seconds": round(seconds, 2),
                    "bytes": sum(p.stat().st_size for p in out.iterdir()),
                    "sha256": digest(out),
                }
            )
        queries = sum(1 for _ in (Path(tmp) / "run1" / "queries.jsonl").open())
    identical = runs[0]["sha256"] == runs[1]["sha256"]
    report = {
        "messages": args.messages,
        "seed": args.seed,
        "queries": queries,
        "seconds": [r["seconds"] for r in runs],
        "output_bytes": runs[0]["bytes"],
        "byte_identical": identical,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(report, indent=2))
    return 0 if identical and max(report["seconds"]) < args.budget_s else 1


if __name__ == "__main__":
    sys.exit(main())
