"""Retrieval at scale: index build time, memory, per-query latency of each channel and of
the whole dual-channel retriever, and bm25s vs rank-bm25 query throughput, measured in
the same run on the same corpus and queries.

Synthetic memories of 10k / 100k / 1M messages: 12 Zipf-distributed words per message,
timestamps spread over three years. The dense part uses random unit vectors of MiniLM's
dimension (384) instead of real embeddings (encoding 1M texts would take hours on this
CPU); latency depends only on the shapes. rank-bm25 is slow at scale, so its throughput
is measured on a subset of the queries (``--rank-bm25-queries``). HNSW is built only up
to ``--hnsw-max`` messages (its build on one core dominates otherwise). Not run in CI.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_retrieval.py --out runs/bench_retrieval.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from datetime import datetime, timedelta

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def latency_ms(fn, inputs) -> dict:
    times = []
    for x in inputs:
        t0 = time.perf_counter()
        fn(x)
        times.append(1e3 * (time.perf_counter() - t0))
    return {"p50_ms": round(float(np.percentile(times, 50)), 3), "p95_ms": round(float(np.percentile(times, 95)), 3),
            "n": len(times)}


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthetic_memory(n: int, rng: np.random.Generator, vocab: int = 50_000, words: int = 12):
    from tider.types import Memory, Message

    ranks = np.minimum(rng.zipf(1.3, size=(n, words)), vocab) - 1
    texts = [" ".join(f"w{r}" for r in row) for row in ranks]
    start = datetime(2021, 1, 1)
    offsets = np.sort(rng.uniform(0, 3 * 365 * 86400, size=n))
    msgs = [Message(id=i, key=str(i), text=t, timestamp=start + timedelta(seconds=float(o)), speaker="u", session="s")
            for i, (t, o) in enumerate(zip(texts, offsets))]
    return Memory(f"bench-{n}", msgs, granularity="minute"), texts


def run_scale(n: int, args, rng: np.random.Generator) -> dict:
    from tider.retrieval.bm25 import BM25Index
    from tider.retrieval.config import RetrievalConfig
    from tider.retrieval.dense import DenseIndex
    from tider.retrieval.retriever import DualChannelRetriever
    from tider.types import Window, WindowPrediction

    out: dict = {"messages": n}
    (memory, texts), out["build_memory_s"] = timed(synthetic_memory, n, rng)
    vecs = rng.normal(size=(n, args.dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    bm25, out["build_bm25s_s"] = timed(BM25Index.from_texts, texts, backend="bm25s")
    flat, out["build_faiss_flat_s"] = timed(DenseIndex, vecs, kind="flat")
    out["dense_vectors_mb"] = round(vecs.nbytes / 2**20, 1)
    sparse = bm25._model.scores
    out["bm25s_index_mb"] = round(sum(sparse[k].nbytes for k in ("data", "indices", "indptr")) / 2**20, 1)
    hnsw = None
    if n <= args.hnsw_max:
        hnsw, out["build_faiss_hnsw_s"] = timed(DenseIndex, vecs, kind="hnsw")
    out["max_rss_mb_after_build"] = round(rss_mb(), 1)

    queries = [" ".join(f"w{r}" for r in np.minimum(rng.zipf(1.3, size=4), 50_000) - 1) for _ in range(args.queries)]
    qvecs = rng.normal(size=(args.queries, args.dim)).astype(np.float32)
    qvecs /= np.linalg.norm(qvecs, axis=1, keepdims=True)
    span = memory.span
    preds = []
    for _ in range(args.queries):  # one or two 30-day windows, like a locator prediction
        ws = []
        for _ in range(int(rng.integers(1, 3))):
            a = span.start + timedelta(days=float(rng.uniform(0, 3 * 365 - 30)))
            ws.append(Window(a, a + timedelta(days=30)))
        preds.append(WindowPrediction(True, tuple(sorted(ws))))
    retr = DualChannelRetriever(memory, bm25, flat, RetrievalConfig(k=args.k, semantic="hybrid"))
    idx = range(args.queries)

    lat = {
        "dense_faiss_flat_topk": latency_ms(lambda i: flat.search(qvecs[i], args.k), idx),
        "dense_full_scores": latency_ms(lambda i: flat.scores(qvecs[i]), idx),
        "bm25s_topk": latency_ms(lambda i: bm25.search(queries[i], args.k), idx),
        "temporal_faiss_idselector_range": latency_ms(
            lambda i: [flat.search(qvecs[i], args.k, id_range=memory.id_range(w)) for w in preds[i].windows], idx),
        "hybrid_similarity": latency_ms(lambda i: retr.similarity(queries[i], qvecs[i]), idx),
        "dual_channel_total": latency_ms(lambda i: retr.rank(retr.similarity(queries[i], qvecs[i]), preds[i], args.k), idx),
    }
    sims = [retr.similarity(queries[i], qvecs[i]) for i in idx]
    lat["dual_channel_rank_given_similarity"] = latency_ms(lambda i: retr.rank(sims[i], preds[i], args.k), idx)
    if hnsw is not None:
        lat["dense_faiss_hnsw_topk"] = latency_ms(lambda i: hnsw.search(qvecs[i], args.k), idx)
    out["latency"] = lat

    # bm25s vs rank-bm25 on the same tokens and queries (rank-bm25 on a subset at scale)
    rank_bm25, out["build_rank_bm25_s"] = timed(BM25Index, bm25.token_lists, backend="rank_bm25")
    sub = queries[: args.rank_bm25_queries if n > 10_000 else len(queries)]
    _, t_fast = timed(lambda: [bm25.search(q, args.k) for q in sub])
    _, t_ref = timed(lambda: [rank_bm25.search(q, args.k) for q in sub])
    out["bm25_throughput"] = {"queries": len(sub), "bm25s_qps": round(len(sub) / t_fast, 1),
                              "rank_bm25_qps": round(len(sub) / t_ref, 2), "speedup": round(t_ref / t_fast, 1)}
    del rank_bm25
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--rank-bm25-queries", type=int, default=5)
    parser.add_argument("--hnsw-max", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--out", default="runs/bench_retrieval.json")
    args = parser.parse_args()

    import faiss

    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(0)
    results = {"hardware": f"{os.cpu_count()} CPU cores visible, 1 thread used (OMP/faiss), no GPU",
               "dense": "random unit vectors, dim %d (not real embeddings)" % args.dim, "scales": []}
    for n in [int(s) for s in args.sizes.split(",")]:
        r = run_scale(n, args, rng)
        results["scales"].append(r)
        print(json.dumps(r, indent=2), flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
