"""The README's results tables, generated from the results files that the benchmarks write.

Each table sits between two markers in README.md:

    <!-- table:NAME -->
    ...generated...
    <!-- /table:NAME -->

and is made from one results JSON by ``TABLES[NAME]``; the line under it names the file,
the commit and the command that wrote it, and the machine. A figure in a table is typed
by no one.

    python scripts/results_tables.py           # rewrite the tables in README.md
    python scripts/results_tables.py --check   # exit 1 when a table differs from its file (CI)
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("none", "rules", "top-day", "top-days", "dbscan-tuned", "timeline", "locator", "oracle")
LEARNING_FREE = ("none", "rules", "top-day", "top-days", "dbscan-tuned", "timeline")
SETS = (("pooled", "pooled"), ("locomo", "LoCoMo"), ("realmem", "RealMem"), ("longmemeval", "LongMemEval_s"))


def short(x: float) -> str:
    return f"{x:.3f}".removeprefix("0")


def _best(values: dict[str, float], among) -> str:
    return max(among, key=lambda m: values.get(m, -1.0))


def real_table(results: dict) -> list[str]:
    """bench/bench_real.py's results.json: recall@20 (hit_all@20) per set and method, the
    best learning-free source and the better of it and the locator in bold."""
    methods = [m for m in METHODS if m in results["summary"]["pooled"]["recall@20"]]
    lines = [
        "| recall@20 (hit_all@20) | " + " | ".join(methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for key, label in SETS:
        row = results["summary"].get(key)
        if row is None:
            continue
        recall, hit = row["recall@20"], row["hit_all@20"]
        best = _best(recall, [m for m in LEARNING_FREE if m in recall])
        bold = {best, "locator"} if recall.get("locator", -1) >= recall[best] else {best}
        cells = [f"{short(recall[m])} ({short(hit[m])})" for m in methods]
        cells = [f"**{c}**" if m in bold else c for m, c in zip(methods, cells)]
        lines.append(f"| {label}, {row['n_queries']} | " + " | ".join(cells) + " |")
    pooled = results["summary"]["pooled"]["mcnemar"]
    tests = ", ".join(f"`{m}` b {t['b']} / c {t['c']}, p {t['p']:.2g}" for m, t in pooled.items())
    lines += ["", f"Exact McNemar on hit_all@20, pooled (b = the locator hits and the baseline misses): {tests}."]
    return lines


def floor_table(results: dict) -> list[str]:
    """bench/bench_floor.py's results: recall@20 (hit_all@20) of the learning-free sources
    per dataset, every question; the seconds each memory took to index, and where the row ran
    (a run of some sets keeps the others' rows)."""
    windows = ("none", "rules", "top-days")
    lines = [
        "| dataset, questions | " + " | ".join(f"`{w}`" for w in windows) + " | index s per memory: mean / p50 / max |",
        "|---|" + "---|" * (len(windows) + 1),
    ]
    for key, label in SETS:
        row = results["sets"].get(key)
        if row is None:
            continue
        recall, hit, build = row["recall@20"], row["hit_all@20"], row["index_build_s"]
        best = _best(recall, windows)
        cells = [f"{short(recall[w])} ({short(hit[w])})" for w in windows]
        cells = [f"**{c}**" if w == best else c for w, c in zip(windows, cells)]
        ran = f"`{row['commit']}`, load {row['load_1min']}"
        timing = f"{build['mean']:.2f} / {build['p50']:.2f} / {build['max']:.2f} ({build['memories']}; {ran})"
        lines.append(f"| {label}, {row['n_queries']} | " + " | ".join(cells) + f" | {timing} |")
    return [*lines, ""]


def stamp(path: str, script: str, results: dict) -> str:
    minutes = results.get("timings_s", {}).get("total_s")
    took = f", {minutes / 60:.0f} min" if minutes else ""
    commit = results.get("commit", "not recorded")
    command = results.get("command") or " ".join([script, *results.get("argv", [])])
    reads = results.get("test_reads")
    read = f"; test-split read {reads['reads_of_this_design']} of this design" if reads else ""
    machine = results.get("hardware", "machine not recorded")
    return f"From `{path}` (commit `{commit}`; `{command}`; {machine}{took}{read})."


# name: (results file, how its table is made, the script that writes the file)
TABLES: dict[str, tuple[str, Callable[[dict], list[str]], str]] = {
    "real": ("bench/results/bench_real_test.json", real_table, "bench/bench_real.py"),
    "floor": ("bench/results/retrieval_floor.json", floor_table, "bench/bench_floor.py"),
}


def render(name: str, root: Path = ROOT) -> str:
    path, make, script = TABLES[name]
    results = json.loads((root / path).read_text())
    return "\n".join([*make(results), stamp(path, script, results)])


def regenerate(text: str, root: Path = ROOT) -> str:
    """``text`` with every marked table made anew; an unknown or unclosed marker is an error."""
    for name in re.findall(r"<!-- table:([\w-]+) -->", text):
        if name not in TABLES:
            raise SystemExit(f"README.md names table {name!r}; scripts/results_tables.py knows {sorted(TABLES)}")
        block = re.compile(rf"(<!-- table:{name} -->\n)(?:.*?\n)?(<!-- /table:{name} -->)", re.DOTALL)
        if not block.search(text):
            raise SystemExit(f"README.md: table {name!r} has no closing <!-- /table:{name} --> marker")
        text = block.sub(lambda m, n=name: m.group(1) + render(n, root) + "\n" + m.group(2), text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md's tables differ from their files")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    args = ap.parse_args(argv)
    readme = Path(args.readme)
    text = readme.read_text()
    fresh = regenerate(text)
    if args.check:
        if fresh != text:
            diff = difflib.unified_diff(text.splitlines(), fresh.splitlines(), "README.md", "generated", lineterm="")
            print("\n".join(diff), file=sys.stderr)
            print("README.md's tables differ from their results files: run scripts/results_tables.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
