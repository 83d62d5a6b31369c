"""What the dense half of the index-backed path costs at the exact path's RRF depth.

Exact scoring fuses dense and BM25 ranks down to ``rrf_depth`` (1000), so a query path
that returns exact scoring's top-20 needs the dense top-1000 with its order (a BM25 top
hit ranked 600th by the dense channel still gets 1/(60 + 600) from it, enough to decide a
place in the top 20; ``bench_retrieval.py`` measured depth 100 keeping the top-20 on 0-42%
of queries). This measures, on random unit vectors (the bench's dense part), one thread:

* the read floor: one pass over the bytes of the float32 vectors (a sum of 8-byte words),
  which any exact scan pays, and over a quarter of them (the size of int8 codes);
* exact top-1000: numpy (what ``tider.retrieval.dense.exact_top`` does), faiss
  ``IndexFlatIP``;
* compressed scans re-ranked exactly (``IndexRefineFlat``, k_factor 2): faiss scalar
  quantizers fp16, 8-bit and 4-bit;
* HNSW (M 32, efSearch 1000) where ``--hnsw`` sizes ask for it;

with each list's recall of the exact top-1000 set and the share of positions it gets
exactly right.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_dense_floor.py --out runs/bench_dense_floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

DEPTH, DIM = 1000, 384


def unit(rng, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def timed(fn, queries) -> tuple[list, dict]:
    fn(queries[0])  # warm-up
    outs, ms = [], []
    for q in queries:
        t0 = time.perf_counter()
        outs.append(fn(q))
        ms.append((time.perf_counter() - t0) * 1e3)
    return outs, {"p50_ms": round(float(np.median(ms)), 3), "p95_ms": round(float(np.percentile(ms, 95)), 3)}


def agreement(lists, exact) -> dict:
    recall = [len(np.intersect1d(a, b)) / DEPTH for a, b in zip(lists, exact)]
    same = [float(np.mean(np.asarray(a)[:DEPTH] == b)) for a, b in zip(lists, exact)]
    return {"recall_top1000": round(float(np.mean(recall)), 4), "same_position": round(float(np.mean(same)), 4)}


def numpy_top(x):
    from tider.retrieval.dense import exact_top  # the exact path's own brute force

    def top(q):
        ids, scores = exact_top(x, q, DEPTH)
        return ids[np.lexsort((ids, -scores))]

    return top


def faiss_top(index):
    return lambda q: index.search(q[None], DEPTH)[1][0]


def refined(faiss, x, qtype):
    sq = faiss.IndexScalarQuantizer(DIM, qtype, faiss.METRIC_INNER_PRODUCT)
    index = faiss.IndexRefineFlat(sq)
    index.k_factor = 2.0
    index.train(x[: min(len(x), 100_000)])
    index.add(x)
    return index


def one_size(n: int, n_queries: int, hnsw: bool) -> dict:
    import faiss

    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(n)
    x, queries = unit(rng, n), unit(rng, n_queries)
    row = {"messages": n, "float32_mb": round(x.nbytes / 2**20, 1)}
    words = x.reshape(-1).view(np.uint64)  # a byte-for-byte pass: summing 8-byte words
    _, row["read_float32"] = timed(lambda q: words.sum(), queries[:10])
    _, row["read_int8"] = timed(lambda q: words[: len(words) // 4].sum(), queries[:10])
    exact, row["numpy_exact"] = timed(numpy_top(x), queries)
    flat = faiss.IndexFlatIP(DIM)
    flat.add(x)
    lists, row["faiss_flat"] = timed(faiss_top(flat), queries)
    row["faiss_flat"].update(agreement(lists, exact))
    for name, qtype in (("sq_fp16_refine", "QT_fp16"), ("sq_8bit_refine", "QT_8bit"), ("sq_4bit_refine", "QT_4bit")):
        t0 = time.perf_counter()
        index = refined(faiss, x, getattr(faiss.ScalarQuantizer, qtype))
        lists, row[name] = timed(faiss_top(index), queries)
        row[name].update(agreement(lists, exact), build_s=round(time.perf_counter() - t0, 1))
        del index
    if hnsw:
        t0 = time.perf_counter()
        graph = faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT)
        graph.add(x)
        graph.hnsw.efSearch = DEPTH
        lists, row["hnsw_ef1000"] = timed(faiss_top(graph), queries)
        row["hnsw_ef1000"].update(agreement(lists, exact), build_s=round(time.perf_counter() - t0, 1))
    return row


def table(rows: list[dict]) -> str:
    methods = [
        m
        for m in ("numpy_exact", "faiss_flat", "sq_fp16_refine", "sq_8bit_refine", "sq_4bit_refine", "hnsw_ef1000")
        if any(m in r for r in rows)
    ]
    lines = [
        "| messages | read float32 / int8 (ms) | "
        + " | ".join(f"{m} p50 ms (recall, same pos)" for m in methods)
        + " |",
        "|---" * (2 + len(methods)) + "|",
    ]
    for r in rows:
        cells = []
        for m in methods:
            v = r.get(m)
            cells.append(
                "–"
                if v is None
                else f"{v['p50_ms']}"
                + (f" ({v['recall_top1000']}, {v['same_position']})" if "recall_top1000" in v else " (exact)")
            )
        lines.append(
            f"| {r['messages']:,} | {r['read_float32']['p50_ms']} / {r['read_int8']['p50_ms']} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    from tider.hardware import describe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--hnsw", default="100000", help="sizes that also build an HNSW graph ('' = none)")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--out", default="runs/bench_dense_floor.json")
    args = ap.parse_args(argv)
    hnsw_sizes = {int(s) for s in args.hnsw.split(",") if s}
    rows = [one_size(int(s), args.queries, int(s) in hnsw_sizes) for s in args.sizes.split(",")]
    result = {
        "hardware": describe(),
        "threads": 1,
        "depth": DEPTH,
        "dim": DIM,
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(result["hardware"], "load", [round(v, 2) for v in result["load_average"]])
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
