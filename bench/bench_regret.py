"""What a right window gains and a wrong one costs, under several fusions of the semantic and
temporal channels (the regret table), and where a retrieve-then-localize locator can win.

    python bench/bench_regret.py --dataset locomo --path LOCOMO_DEV.json --out bench/results/regret_locomo.json
    python bench/bench_regret.py --dataset realmem --path REALMEM_DIR --out bench/results/regret_realmem.json
    python bench/bench_regret.py --dataset synthetic --memories 3 --out bench/results/regret_synthetic.json

For every query with gold windows: mean over queries of the share of its evidence in the top
20 (per-question recall@20), searched with no windows; with its gold windows; with one
wrong window (a one-day window on a random earlier day of the memory more than a day from
every gold window, seeded); with both; and with the day of the semantic channel's top hit
(``top-day``). The fusions:

- ``rrf of each top k (shipped)``: what ``MemoryStore.retrieve`` does (each channel
  nominates its top k, the nominations are fused by rank; ``tider.retrieval.retriever``);
  ``shipped_path_agrees`` checks the recomputation against the store's own results;
- ``rrf of the full rankings``: rank fusion without the nomination cut (and ``c=10``);
- ``tider l/g``: TIDER's rerank, ``sim * max(g, exp(-0.05 d)) + l * [inside]`` over windows
  widened by 14 days (the fusion before rank fusion; recomputed here from the same ``sim``);
- ``quota s``: the window's best messages take a share ``s`` of the top 20, the semantic
  channel the rest.

It also reports how often the gold day is among the first 1 / 3 / 5 distinct days of the
semantic channel's top 50, and the choose-or-abstain bound: a window on whichever of the
first K such days gains most, or none when none gains (the most a locator choosing among
K candidate days can reach), under the shipped fusion.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from tider.data import load_dataset
from tider.data.gold import unit_window
from tider.memory import MemoryCollection
from tider.retrieval import channels
from tider.types import WindowPrediction

K = 20
CASES = ("none", "gold", "wrong", "gold+wrong", "top-day")


def in_window_order(sim, ts, windows):
    inside = channels.ids_in_ranges(channels.id_ranges(ts, channels.window_days(windows)))
    return inside[np.lexsort((inside, -sim[inside]))]


def fuse_rrf(sim, order, ts, windows, c=60, depth=None):
    """RRF of the semantic ranking and the in-window ranking, each cut at ``depth`` (None:
    the full rankings); ties to the window's message, then the earlier one."""
    if not windows:
        return order[:K]
    score = np.zeros(len(sim))
    semantic = order[:depth]
    score[semantic] += 1.0 / (c + np.arange(1, len(semantic) + 1))
    window = in_window_order(sim, ts, windows)[:depth]
    score[window] += 1.0 / (c + np.arange(1, len(window) + 1))
    nominated = np.zeros(len(sim), dtype=bool)
    nominated[window] = True
    return np.lexsort((np.arange(len(sim)), ~nominated, -score))[:K]


def fuse_tider(sim, order, ts, windows, boost, gamma_min, rho=0.05, buffer_days=14.0):
    if not windows:
        return order[:K]
    days = channels.window_days(windows)
    pool = np.union1d(order[:K], channels.ids_in_ranges(channels.id_ranges(ts, days, buffer_days)))
    t = ts[pool][:, None]
    dist = np.maximum(np.maximum(days[None, :, 0] - t, t - days[None, :, 1]), 0.0).min(axis=1)
    score = sim[pool] * np.maximum(gamma_min, np.exp(-rho * dist)) + boost * (dist == 0)
    return pool[np.lexsort((pool, -score))[:K]]


def fuse_quota(sim, order, ts, windows, share):
    if not windows:
        return order[:K]
    window = list(in_window_order(sim, ts, windows)[: round(share * K)])
    taken = set(window)
    return np.array(window + [i for i in order[: 2 * K] if i not in taken][: K - len(window)])


SHIPPED = "rrf of each top k (shipped)"
FUSIONS = {
    "rrf of each top k (shipped)": lambda s, o, t, w: fuse_rrf(s, o, t, w, 60, K),
    "rrf of the full rankings": lambda s, o, t, w: fuse_rrf(s, o, t, w, 60),
    "rrf of the full rankings, c=10": lambda s, o, t, w: fuse_rrf(s, o, t, w, 10),
    "tider 0.3/0.3 (before)": lambda s, o, t, w: fuse_tider(s, o, t, w, 0.3, 0.3),
    "tider 0.1/0.3": lambda s, o, t, w: fuse_tider(s, o, t, w, 0.1, 0.3),
    "tider 0/0.6": lambda s, o, t, w: fuse_tider(s, o, t, w, 0.0, 0.6),
    "quota 0.5": lambda s, o, t, w: fuse_quota(s, o, t, w, 0.5),
}


def day_of(ts: datetime):
    return unit_window(ts, ts, "day")


def case_windows(query, memory, order, visible, rnd) -> dict:
    gold_days = {memory[i].timestamp.date() for i in query.gold.evidence_ids}
    days = sorted({memory[i].timestamp.date() for i in range(visible)})
    wrong_days = [d for d in days if all(abs((d - g).days) > 1 for g in gold_days)]
    if not wrong_days:
        return {}
    wrong = day_of(datetime.combine(rnd.choice(wrong_days), datetime.min.time()))
    gold = list(query.gold.windows)
    return {
        "none": [],
        "gold": gold,
        "wrong": [wrong],
        "gold+wrong": gold + [wrong],
        "top-day": [day_of(memory[int(order[0])].timestamp)],
    }


def one_day(day) -> WindowPrediction:
    return WindowPrediction(True, (day_of(datetime.combine(day, datetime.min.time())),))


def candidate_days(memory, order, depth=50, n=5) -> list:
    days = []
    for i in order[:depth]:
        d = memory[int(i)].timestamp.date()
        if d not in days:
            days.append(d)
    return days[:n]


def recall(ids, gold) -> float:
    return len(gold & {int(i) for i in ids}) / len(gold)


def measure(dataset, seed: int = 0) -> dict:
    store = MemoryCollection(dataset.memories)
    queries = [q for q in dataset.queries if q.gold.evidence_ids and q.gold.windows and str(q.category) != "5"]
    store.prepare(queries)
    rnd = random.Random(seed)
    rows = {f: {c: [] for c in CASES} for f in FUSIONS}
    shipped_agrees, first_k, choose = 0, {1: 0, 3: 0, 5: 0}, {1: [], 3: [], 5: []}
    for q in queries:
        memory = store.messages(q.memory_key)
        ranked = store.ranking(q.public())
        order, visible = ranked.ids, len(ranked.ids)
        sim = np.zeros(visible, dtype=np.float32)
        sim[order] = ranked.sim
        ts = np.array([channels.to_days(memory[i].timestamp) for i in range(visible)])
        cases = case_windows(q, memory, order, visible, rnd)
        if not cases:
            continue
        gold = set(q.gold.evidence_ids)
        for name, fuse in FUSIONS.items():
            for case, windows in cases.items():
                rows[name][case].append(recall(fuse(sim, order, ts, windows), gold))
        shipped = store.retrieve(q.public(), WindowPrediction(True, tuple(cases["gold+wrong"])))[0]
        shipped_agrees += recall(shipped, gold) == rows[SHIPPED]["gold+wrong"][-1]
        days = candidate_days(memory, order)
        gold_days = {memory[i].timestamp.date() for i in gold}
        base = rows[SHIPPED]["none"][-1]
        gains = [recall(store.retrieve(q.public(), one_day(d))[0], gold) - base for d in days]
        for k in first_k:
            first_k[k] += bool(gold_days & set(days[:k]))
            choose[k].append(base + max([0.0, *gains[:k]]))
    n = len(rows[SHIPPED]["none"])
    return {
        "n_queries": n,
        "regret": {f: {c: float(np.mean(v)) for c, v in r.items()} for f, r in rows.items()},
        "shipped_path_agrees": shipped_agrees / max(n, 1),
        "gold_day_in_first_k_hit_days": {k: v / max(n, 1) for k, v in first_k.items()},
        "choose_or_abstain_among_k": {k: float(np.mean(v)) for k, v in choose.items()},
    }


def markdown(result: dict, name: str) -> str:
    lines = [
        f"{name}, {result['n_queries']} queries (mean per-question recall@20)",
        "",
        "| fusion | " + " | ".join(CASES) + " |",
        "|---" * (len(CASES) + 1) + "|",
    ]
    lines += [f"| {f} | " + " | ".join(f"{r[c]:.3f}" for c in CASES) + " |" for f, r in result["regret"].items()]
    first, choose = result["gold_day_in_first_k_hit_days"], result["choose_or_abstain_among_k"]
    lines += [
        "",
        "gold day among the first 1 / 3 / 5 hit days: " + " / ".join(f"{first[k]:.2f}" for k in first),
        "choose-or-abstain among 1 / 3 / 5 (shipped fusion): " + " / ".join(f"{choose[k]:.3f}" for k in choose),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True, choices=["locomo", "realmem", "synthetic"])
    ap.add_argument("--path", default=None)
    ap.add_argument("--memories", type=int, default=None, help="only the first N memories (sorted by key)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    dataset = load_dataset(args.dataset, args.path)
    if args.memories:
        keep = sorted(dataset.memories)[: args.memories]
        dataset.memories = {k: dataset.memories[k] for k in keep}
        dataset.queries = [q for q in dataset.queries if q.memory_key in keep]
    t0 = time.time()
    result = {"dataset": args.dataset, **measure(dataset, args.seed), "seconds": time.time() - t0}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(markdown(result, args.dataset))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
