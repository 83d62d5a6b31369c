"""Is there a learnable signal for *which* learning-free window to use, per question?

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_chooser.py --data ../shared/data \
        --out bench/results/bench_chooser.json

Issue 45 asks the locator to learn when each cue helps. Before another SFT/GRPO design, this
measures whether the retrieval's own statistics carry that signal at all. For every scored
question of LoCoMo dev and RealMem dev (the tiny-real recipes' fixed split), through the
shipped retriever, recall@20 of each *action*: no window, ``rules``, ``top-days`` (the first
three days the semantic ranking hits), and each of those first five days alone. Per question,
features a prompt could show as numbers: for each candidate day its first hit's rank, its hits
in the top 20, its best similarity less the top one, and its distance from the question's day;
whether ``rules`` names a window, the question's length. A chooser fitted on the *train*
memories (a gradient-boosted regressor of each action's recall gain over ``top-days``;
scikit-learn) picks one action per question of the *validation* memories. Reported on
validation only (the test memories are not read): each action's recall@20, the chooser's, the
per-question oracle among the actions, and the chooser's paired difference to ``top-days``
with a 95% bootstrap CI.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from benchlib import ROOT, commit, hardware

DAYS = 5  # candidate days: the first five distinct days of the semantic ranking
K = 20


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--out", default="bench/results/bench_chooser.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", default="runs/chooser_rows.json", help="per-question recalls and features (reused)")
    return ap.parse_args(argv)


def load(data: Path):
    from tider.data import load_datasets
    from tider.data.splits import split_queries

    recipe = yaml.safe_load((ROOT / "configs/grpo/tiny-real.yaml").read_text())
    dataset = load_datasets("locomo,realmem", f"{data / 'locomo' / 'locomo_dev.json'},{data / 'realmem'}")
    fixed = {"validation": recipe["validation_memories"], "test": recipe["test_memories"]}
    splits = split_queries(dataset, recipe.get("split_seed", 0), **fixed)
    keep = lambda qs: [q for q in qs if q.gold.evidence_ids and str(q.category) not in ("5", "adversarial")]
    return dataset, keep(splits["train"]), keep(splits["validation"])


def actions_of(query, store, sources) -> tuple[dict, list]:
    """{action: WindowPrediction} and the candidate days with their stats. The candidates are
    ``top-day``'s first ``DAYS`` hit days and the ``top-days`` action is the shipped source,
    so the baseline here is the one the benchmarks read."""
    from tider.data.gold import unit_window
    from tider.types import NON_TEMPORAL, WindowPrediction

    public = query.public()
    memory, ranked = store.messages(query.memory_key), store.ranking(public)
    windows = sources["days"].hit_days(public, store)
    days = {w: {"window": w, "first_rank": None, "hits20": 0} for w in windows}
    for rank, (i, s) in enumerate(zip(ranked.ids, ranked.sim)):
        m = memory[int(i)]
        d = days.get(unit_window(m.timestamp, m.timestamp, "day"))
        if d is not None and d["first_rank"] is None:
            d.update(first_rank=rank, best=float(s), date=m.timestamp.date())
        if d is not None and rank < K:
            d["hits20"] += 1
        if rank >= K and all(d["first_rank"] is not None for d in days.values()):
            break
    top = float(ranked.sim[0]) if len(ranked.sim) else 0.0
    for d in days.values():
        d["gap"] = top - d["best"]
    acts = {"none": NON_TEMPORAL, "rules": sources["rules"].predict(public, store)}
    if windows:
        acts["top-days"] = sources["top-days"].predict(public, store)
    for j, w in enumerate(windows):
        acts[f"day{j + 1}"] = WindowPrediction(True, (w,))
    return acts, [days[w] for w in windows]


def features(query, days, rules_pred) -> list[float]:
    asked = query.asked_at.date()
    row = [float(rules_pred.temporal and bool(rules_pred.windows)), float(len(query.text.split()))]
    for j in range(DAYS):
        if j < len(days):
            d = days[j]
            row += [d["first_rank"], d["hits20"], d["gap"], (asked - d["date"]).days]
        else:
            row += [999.0, 0.0, 1.0, 9999.0]
    return row


def measure(store, queries, sources) -> list[dict]:
    rows = []
    for q in queries:
        acts, days = actions_of(q, store, sources)
        gold = set(q.gold.evidence_ids)
        recall = {}
        for name, pred in acts.items():
            ids = store.retrieve(q, pred, K)[0]
            recall[name] = len(gold & {int(i) for i in ids}) / len(gold)
        recall.setdefault("top-days", recall["none"])
        rows.append(
            {
                "key": q.key,
                "dataset": "locomo" if q.memory_key.startswith("conv-") else "realmem",
                "recall": recall,
                "x": features(q, days, acts["rules"]),
            }
        )
    return rows


ACTIONS = ("none", "rules", "top-days", *(f"day{j + 1}" for j in range(DAYS)))
SOURCES = ("none", "rules", "top-days", "day1")  # the whole learning-free sources (day1 = top-day)


def fit_chooser(train: list[dict], seed: int, actions=ACTIONS):
    """One regressor per action: its recall gain over top-days from the question's features."""
    from sklearn.ensemble import GradientBoostingRegressor

    x = np.array([r["x"] for r in train])
    models = {}
    for a in actions:
        y = np.array([r["recall"].get(a, r["recall"]["none"]) - r["recall"]["top-days"] for r in train])
        models[a] = GradientBoostingRegressor(n_estimators=100, max_depth=2, learning_rate=0.05, random_state=seed)
        models[a].fit(x, y)
    return models


def choose(models, rows: list[dict]) -> list[str]:
    x = np.array([r["x"] for r in rows])
    names = list(models)
    gains = np.stack([models[a].predict(x) for a in names], axis=1)
    return [names[j] for j in gains.argmax(axis=1)]


def bootstrap(diff: np.ndarray, seed: int, n: int = 10000) -> list[float]:
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(n, len(diff)))].mean(axis=1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def table(rows: list[dict], picks: list[str], seed: int) -> dict:
    get = lambda r, a: r["recall"].get(a, r["recall"]["none"])
    out = {a: float(np.mean([get(r, a) for r in rows])) for a in ACTIONS}
    chosen = np.array([get(r, a) for r, a in zip(rows, picks)])
    base = np.array([r["recall"]["top-days"] for r in rows])
    out["chooser"] = float(chosen.mean())
    out["oracle among actions"] = float(np.mean([max(get(r, a) for a in ACTIONS) for r in rows]))
    out["chooser - top-days"] = float((chosen - base).mean())
    out["chooser - top-days 95% CI"] = bootstrap(chosen - base, seed)
    out["picks"] = {a: picks.count(a) for a in ACTIONS if picks.count(a)}
    out["n"] = len(rows)
    return out


def by_dataset(rows: list[dict], picks: list[str], seed: int) -> dict:
    part = lambda ds: ([r for r in rows if r["dataset"] == ds], [p for r, p in zip(rows, picks) if r["dataset"] == ds])
    return {"pooled": table(rows, picks, seed), **{ds: table(*part(ds), seed) for ds in ("locomo", "realmem")}}


def main(argv=None) -> int:
    args = parse_args(argv)
    from tider.locator.sources import make_source
    from tider.memory import MemoryCollection

    t0 = time.time()
    rows_file = Path(args.rows)
    if rows_file.exists():
        train, val = json.loads(rows_file.read_text()).values()
    else:
        dataset, train_q, val_q = load(Path(args.data))
        store = MemoryCollection(dataset.memories)
        store.prepare([*train_q, *val_q])
        sources = {name: make_source(name) for name in ("rules", "top-days")}
        sources["days"] = make_source("top-day", days=DAYS)
        train, val = measure(store, train_q, sources), measure(store, val_q, sources)
        rows_file.parent.mkdir(parents=True, exist_ok=True)
        rows_file.write_text(json.dumps({"train": train, "validation": val}))
    result = {
        "commit": commit(),
        "command": " ".join(["OMP_NUM_THREADS=2 .venv/bin/python bench/bench_chooser.py", *sys.argv[1:]]),
        "hardware": hardware(),
        "n_train": len(train),
    }
    for label, actions in (("every action", ACTIONS), ("whole sources", SOURCES)):
        models = fit_chooser(train, args.seed, actions)
        result[label] = {"validation": by_dataset(val, choose(models, val), args.seed)}
        result[label]["train (in-sample)"] = table(train, choose(models, train), args.seed)
    result["seconds"] = time.time() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    for label in ("every action", "whole sources"):
        for name, row in result[label]["validation"].items():
            ci = ", ".join(f"{v:+.3f}" for v in row["chooser - top-days 95% CI"])
            gain, oracle = row["chooser - top-days"], row["oracle among actions"]
            print(f"{label:>14} {name:>8} n {row['n']:>3}: top-days {row['top-days']:.3f}, chooser ", end="")
            print(f"{row['chooser']:.3f} ({gain:+.3f} [{ci}]), oracle {oracle:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
