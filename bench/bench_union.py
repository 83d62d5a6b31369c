"""Does the locator help as an addition to `top-days` rather than a replacement? (issue 45)

Reads a finished `bench/bench_real.py` run's comparison (its `retrieve-locator.jsonl`: the
locator's windows per question), and scores on the same questions and retriever:
`top-days`, `rules`, the locator's windows, and the unions of `top-days` with each (the
other's windows added to the first three days the search hits). Per dataset, recall@20 and hit_all@20, with McNemar's
b/c of each against `top-days` on hit_all@20. No model runs: the locator's answers are the
recorded ones, so the union costs only retrieval.

    python bench/bench_union.py --run runs/lme-val --out bench/results/bench_union.json
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
DATA = ROOT.parent / "shared" / "data"


def recorded_windows(path: Path, granularity: str) -> dict:
    """query key -> the locator's recorded WindowPrediction."""
    from tider.data.gold import unit_window
    from tider.types import WindowPrediction

    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["status"] != "ok":
            continue
        pred = row["record"]["prediction"]
        windows = tuple(
            unit_window(datetime.fromisoformat(w["start"]), datetime.fromisoformat(w["end"]), granularity)
            for w in pred["windows"]
        )
        out[row["key"]] = WindowPrediction(temporal=bool(pred["temporal"] and windows), windows=windows)
    return out


class Union:
    """The windows of ``a`` and ``b`` together (none when neither names one)."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def predict(self, query, store):
        from tider.types import WindowPrediction

        both = set()
        for source in (self.a, self.b):
            pred = source.predict(query, store)
            both |= set(pred.windows if pred.temporal else ())
        return WindowPrediction(temporal=bool(both), windows=tuple(sorted(both)))


class Recorded:
    """The locator's recorded answer for each question (no model runs)."""

    def __init__(self, by_key: dict):
        self.by_key = by_key

    def predict(self, query, store):
        return self.by_key[query.key]


def table(rows: dict, keys: list[str]) -> dict:
    """recall@20, hit_all@20 (the harness's ``aggregate``) and exact McNemar on hit_all@20
    against `top-days` (b: the source finds all the evidence, `top-days` does not) on ``keys``."""
    from tider.eval.metrics import aggregate
    from tider.eval.stats import mcnemar_exact

    base = [bool(rows["top-days"][k]["all@20"]) for k in keys]
    out = {}
    for source, recs in rows.items():
        report = aggregate([recs[k] for k in keys], (20,))
        test = mcnemar_exact([bool(recs[k]["all@20"]) for k in keys], base)
        out[source] = {
            "recall@20": report["recall@20"],
            "hit_all@20": report["hit_all@20"],
            "mcnemar_vs_top_days": {"b": test["b"], "c": test["c"], "p": test["p"]},
        }
    return out


def main(argv=None) -> int:
    from benchlib import commit

    from tider.data import load_datasets
    from tider.eval.retrieval import eligible_queries, query_record
    from tider.locator.sources import make_source
    from tider.memory import MemoryCollection

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=ROOT / "runs" / "lme-val")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "bench_union.json")
    args = ap.parse_args(argv)
    retrieval = args.run / "compare" / "retrieval"
    config = json.loads((retrieval / "manifest.json").read_text())["config"]
    paths = [str(DATA / "locomo" / "locomo_dev.json"), str(DATA / "realmem"), str(args.run / "longmemeval_sample.json")]
    dataset = load_datasets("locomo,realmem,longmemeval", ",".join(paths))
    queries = eligible_queries(dataset, config["exclude"], config["memory_keys"])
    store = MemoryCollection(dataset.memories)
    store.prepare(queries)
    locator = Recorded(recorded_windows(retrieval / "retrieve-locator.jsonl", dataset.granularity))
    top_days, rules = make_source("top-days"), make_source("rules")
    sources = {
        "top-days": top_days,
        "rules": rules,
        "rules ∪ top-days": Union(rules, top_days),
        "locator": locator,
        "locator ∪ top-days": Union(locator, top_days),
    }
    rows = {
        name: {q.key: query_record(q, s, store, (20,), dataset.granularity) for q in queries}
        for name, s in sources.items()
    }
    command = " ".join(["OMP_NUM_THREADS=2 .venv/bin/python bench/bench_union.py", *sys.argv[1:]])
    result = {"command": command, "commit": commit(), "run": str(args.run), "n": len(queries), "per_dataset": {}}
    groups = {"pooled": set(config["memory_keys"]), **dataset.stats["memories_of"]}
    for name, memories in groups.items():
        keys = [q.key for q in queries if q.memory_key in set(memories)]
        if keys:
            result["per_dataset"][name] = {"n": len(keys), "table": table(rows, keys)}
            print(
                name, len(keys), {s: round(t["recall@20"], 3) for s, t in result["per_dataset"][name]["table"].items()}
            )
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
