"""Retrieval metrics over per-query records (binary relevance = gold evidence ids).

* evidence recall@k: micro-averaged over evidence units (T-Mem Eq. 9-10):
  sum_q |gold_q ∩ top-k_q| / sum_q |gold_q|
* all-evidence hit@k: fraction of queries whose whole gold set is in the top-k
* nDCG@k: binary gains, ideal DCG over min(|gold|, k) items
* MRR: 1 / rank of the first gold item in the retrieved list (0 when none)
* window IoU (``scoring.window_iou``), switch accuracy and F1 (positive = temporal),
  mean number of predicted windows.

Per-query values are computed once in ``query_metrics`` and stored in the run records;
``aggregate`` turns any subset of records into the report numbers, so the overall,
per-category and per-bucket tables all come from the same code.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def query_metrics(retrieved: Sequence[int], gold: Iterable[int], ks: Sequence[int]) -> dict:
    gold = set(gold)
    rank_of = {doc: r for r, doc in enumerate(retrieved, start=1)}
    gold_ranks = sorted(rank_of[g] for g in gold if g in rank_of)
    out = {"n_gold": len(gold), "rr": 1.0 / gold_ranks[0] if gold_ranks else 0.0}
    for k in ks:
        hits = sum(1 for r in gold_ranks if r <= k)
        dcg = sum(1.0 / math.log2(r + 1) for r in gold_ranks if r <= k)
        idcg = sum(1.0 / math.log2(i + 1) for i in range(1, min(len(gold), k) + 1))
        out[f"hits@{k}"] = hits
        out[f"all@{k}"] = int(bool(gold) and hits == len(gold))
        out[f"ndcg@{k}"] = dcg / idcg if idcg else 0.0
    return out


def switch_f1(pred: Sequence[bool], gold: Sequence[bool]) -> float:
    tp = sum(1 for p, g in zip(pred, gold) if p and g)
    fp = sum(1 for p, g in zip(pred, gold) if p and not g)
    fn = sum(1 for p, g in zip(pred, gold) if g and not p)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def aggregate(records: Sequence[dict], ks: Sequence[int]) -> dict:
    """Report numbers for a list of per-query records (see ``tider.eval.retrieval``)."""
    n = len(records)
    if not n:
        return {"n": 0}
    units = sum(r["n_gold"] for r in records)
    out: dict = {"n": n}
    for k in ks:
        out[f"recall@{k}"] = sum(r[f"hits@{k}"] for r in records) / units if units else 0.0
        out[f"hit_all@{k}"] = sum(r[f"all@{k}"] for r in records) / n
        out[f"ndcg@{k}"] = sum(r[f"ndcg@{k}"] for r in records) / n
    out["mrr"] = sum(r["rr"] for r in records) / n
    out["window_iou"] = sum(r["iou"] for r in records) / n
    out["switch_acc"] = sum(r["switch"] for r in records) / n
    out["switch_f1"] = switch_f1([r["pred_temporal"] for r in records], [r["gold_temporal"] for r in records])
    out["windows_per_query"] = sum(r["n_windows"] for r in records) / n
    out["temporal_rate"] = sum(1 for r in records if r["pred_temporal"]) / n
    return out
