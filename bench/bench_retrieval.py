"""Retrieval at scale through ``TemporalMemory``: the code the product runs, one thread.

Per size (10k / 100k / 1M messages), in one run on one corpus and one query set:
- ``add`` throughput with precomputed vectors (batches of n/20, each committed to disk);
- build time of each index (bm25s, faiss: exact flat or HNSW by size, the timeline);
- RSS, store size on disk, reopen time (open + first search, nothing re-embedded);
- search p50/p95 for windows ``none``, ``rules`` (the query's words plus a time phrase,
  resolved against a random ``asked_at``) and a fixed 30-day window: the index-backed
  path against exact scoring of every message, and a bare faiss HNSW top-20 query;
- agreement of the index-backed top-20 with the exact top-20 (same set; same order).

Corpus: 12 Zipf(1.3) words per message over three years; the dense part is random unit
vectors of MiniLM's dimension (384), as before: random high-dimensional vectors are the
hardest case for HNSW (no neighbourhood structure), so the agreement here is a floor; the
``--real`` part measures it on real MiniLM vectors (the synthetic benchmark's messages as
one memory, HNSW forced) with that benchmark's own queries. Not run in CI.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_retrieval.py --out runs/bench_retrieval.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
from benchlib import hardware, load

T0 = datetime(2021, 1, 1)


def rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def latency(fn, items) -> dict:
    times = []
    for x in items:
        t0 = time.perf_counter()
        fn(x)
        times.append(1e3 * (time.perf_counter() - t0))
    return {"p50_ms": round(float(np.percentile(times, 50)), 3), "p95_ms": round(float(np.percentile(times, 95)), 3)}


def corpus(n: int, dim: int, rng: np.random.Generator):
    ranks = np.minimum(rng.zipf(1.3, size=(n, 12)), 50_000) - 1
    offsets = np.sort(rng.uniform(0, 3 * 365 * 86400, size=n))
    msgs = [
        {
            "key": str(i),
            "text": " ".join(f"w{r}" for r in row),
            "speaker": "u",
            "session": "s",
            "timestamp": (T0 + timedelta(seconds=float(o))).isoformat(),
        }
        for i, (row, o) in enumerate(zip(ranks, offsets))
    ]
    vecs = rng.normal(size=(n, dim)).astype(np.float32)
    return msgs, vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def query_set(n_queries: int, dim: int, rng: np.random.Generator):
    from tider.types import NON_TEMPORAL, Window, WindowPrediction

    out = []
    for _ in range(n_queries):
        text = " ".join(f"w{r}" for r in np.minimum(rng.zipf(1.3, size=4), 50_000) - 1)
        vec = rng.normal(size=dim).astype(np.float32)
        start = T0 + timedelta(days=float(rng.uniform(0, 3 * 365 - 30)))
        asked_at = T0 + timedelta(days=float(rng.uniform(365, 3 * 365)))
        out.append(
            {
                "text": text,
                "vector": vec / np.linalg.norm(vec),
                "none": NON_TEMPORAL,
                "window": WindowPrediction(True, (Window(start, start + timedelta(days=30)),)),
                # `rules`: the same words plus a time phrase the resolver turns into a window
                # against asked_at (resolved in an untimed first pass, then memoized)
                "rules_text": f"{text} {RULES_PHRASES[int(rng.integers(len(RULES_PHRASES)))]}",
                "asked_at": asked_at,
            }
        )
    return out


RULES_PHRASES = ("last week", "last month", "yesterday", "two weeks ago", "in March", "over the weekend", "3 days ago")


def query_args(q: dict, mode: str) -> tuple[str, object, object]:
    """``(text, asked_at, windows)`` of a bench query in window mode ``mode``: ``none`` /
    ``window`` (a given prediction, no ``asked_at``) or ``rules`` (the source resolves the
    phrase against ``asked_at``)."""
    return (q["rules_text"], q["asked_at"], "rules") if mode == "rules" else (q["text"], None, q[mode])


def call(mem, q: dict, mode: str, k: int, exact: bool):
    text, asked_at, windows = query_args(q, mode)
    return mem.search(text, asked_at=asked_at, windows=windows, query_vector=q["vector"], k=k, exact=exact)


class NoEmbedder:
    model_name = "none (vectors are given)"

    def encode(self, texts):
        raise AssertionError("the bench gives every vector")


def exact_scores(mem, text: str, asked_at, prediction, vector) -> np.ndarray:
    """The exact path's final score of every message the query may see (rank fusion,
    ``tider.retrieval.retriever``)."""
    from tider.retrieval import channels

    query = mem.query(text, asked_at)
    cut = mem.cut(query.asked_at)
    sim = mem.semantic_part(query, vector, True, mem.config.semantic, cut).sim
    if not (prediction.temporal and prediction.windows):
        return sim
    semantic = channels.ranks_of(sim, mem.config.rrf_depth)
    inside = channels.ids_in_ranges(
        channels.id_ranges(mem.state.ts_days()[:cut], channels.window_days(prediction.windows))
    )
    window = np.full(cut, np.inf)
    window[inside[np.lexsort((inside, -sim[inside]))]] = np.arange(1, len(inside) + 1)
    return channels.rrf_similarity(semantic, window, mem.config.rrf_k)


def compare(a, b, scores: np.ndarray) -> tuple[bool, bool, bool]:
    """Same top-k set; same order; same exact scores at every rank (ties count as equal:
    the synthetic benchmark repeats texts, so exact ties are common there)."""
    same_scores = np.allclose(np.sort(scores[a.positions]), np.sort(scores[b.positions]), rtol=1e-6, atol=1e-7)
    return set(a.keys) == set(b.keys), a.keys == b.keys, bool(same_scores) and len(a.keys) == len(b.keys)


def agreement(mem, queries, windows: str, k: int) -> dict:
    rows = []
    for q in queries:
        a, b = call(mem, q, windows, k, False), call(mem, q, windows, k, True)
        text, asked_at, _ = query_args(q, windows)
        rows.append(compare(a, b, exact_scores(mem, text, asked_at, b.prediction, q["vector"])))
    rows = np.array(rows, dtype=np.float64)
    return {
        "same_top_k_set": round(rows[:, 0].mean(), 3),
        "same_top_k_order": round(rows[:, 1].mean(), 3),
        "same_top_k_scores": round(rows[:, 2].mean(), 3),
    }


def search_latencies(mem, queries, k: int, modes, depths) -> dict:
    """Per window mode: exact, and the index-backed path at each dense depth (the faiss
    candidates; exact scoring ranks up to ``rrf_depth`` = 1000 per list)."""
    out = {}
    for name in modes:
        search = lambda exact, name=name: lambda q: call(mem, q, name, k, exact)
        out[name] = {}
        if name == "rules":  # the source resolves each new question once (tens of ms in the
            # library, memoized after): a first pass, kept out of the table, so that both
            # paths are timed on memoized cues
            out[name]["first_pass_exact"] = latency(search(True), queries)
        exact = latency(search(True), queries)
        out[name].update(exact=exact, load_1min=load())
        for depth in depths:
            mem.config.index_depth = depth
            indexed = latency(search(False), queries)
            out[name][f"index_depth_{depth}"] = {
                **indexed,
                "speedup_p50": round(exact["p50_ms"] / indexed["p50_ms"], 1),
                "load_1min": load(),
                **agreement(mem, queries, name, k),
            }
    return out


def bare_hnsw(mem, queries, k: int) -> dict | None:
    import faiss

    index = mem.state.faiss().hnsw
    if index is None:
        return None
    params = faiss.SearchParametersHNSW(efSearch=max(mem.config.hnsw_ef_search, k))
    return latency(lambda q: index.search(q["vector"].reshape(1, -1), k, params=params), queries)


def run_scale(n: int, args, rng: np.random.Generator) -> dict:
    from tider.memory import TemporalMemory

    out: dict = {"messages": n}
    msgs, vecs = corpus(n, args.dim, rng)
    queries = query_set(args.queries, args.dim, rng)
    path = Path(args.workdir) / f"store-{n}"
    reuse = args.reuse and (path / "tider_memory.json").exists()
    if not reuse:
        shutil.rmtree(path, ignore_errors=True)
    from tider.retrieval.config import RetrievalConfig

    # HNSW's one-thread build at 1M takes tens of minutes (more on a shared CPU): --hnsw-max
    # keeps larger sizes on the exact flat index, so their rows measure everything else.
    config = RetrievalConfig() if n <= args.hnsw_max else RetrievalConfig(hnsw_min_messages=10**12)
    mem = TemporalMemory(path, config=config, embedder=NoEmbedder(), granularity="minute", cache_elements=0)
    batch = max(1, n // 20)
    if reuse:  # search timings only: the build figures come from the run that built the store
        out["reused_store"] = str(path)
    else:
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            mem.add(msgs[i : i + batch], vectors=vecs[i : i + batch])
        out["add_msgs_per_s"] = round(n / (time.perf_counter() - t0), 1)
    del msgs, vecs  # the store holds its own copy: keep the bench's peak memory down (1M: ~2 GB)
    _, out["build_bm25_s"] = timed(mem.state.bm25)
    _, out["build_faiss_s"] = timed(mem.state.faiss)
    out["faiss"] = "hnsw + flat tail" if mem.state.faiss().hnsw is not None else "flat (exact)"
    _, out["build_timeline_s"] = timed(mem.timeline)
    out["max_rss_mb"] = rss_mb()
    out["search"] = search_latencies(
        mem, queries, args.k, ["none", "rules", "window"], [int(d) for d in args.depths.split(",")]
    )
    out["bare_faiss_hnsw_top20"] = bare_hnsw(mem, queries, args.k)
    mem.close()
    out["store_mb"] = round(
        int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])
        / 2**20,
        1,
    )
    q = queries[0]
    _, out["reopen_s"] = timed(
        lambda: TemporalMemory(path, config=config, embedder=NoEmbedder()).search(
            q["text"], windows=q["window"], query_vector=q["vector"], k=args.k, exact=False
        )
    )
    out["load_1min"] = load()
    if not args.keep:
        shutil.rmtree(path, ignore_errors=True)
    return out


def run_real(args) -> dict:
    """Agreement, recall and latency on real MiniLM vectors: every synthetic-benchmark
    conversation as one memory (its own queries), HNSW forced, index-backed vs exact."""
    from tider.data import load_dataset
    from tider.memory import TemporalMemory
    from tider.retrieval.config import RetrievalConfig
    from tider.types import NON_TEMPORAL, Memory, WindowPrediction

    ds = load_dataset("synthetic")
    merged = Memory(
        "all",
        [
            replace(m, key=f"{k}/{m.key}", id=i)
            for i, (k, m) in enumerate((k, m) for k, memory in ds.memories.items() for m in memory)
        ],
        ds.granularity,
    )
    remap = {(k, m.id): merged.id_of(f"{k}/{m.key}") for k, memory in ds.memories.items() for m in memory}
    rng = np.random.default_rng(0)
    queries = [
        ds.queries[i] for i in rng.choice(len(ds.queries), size=min(args.real_queries, len(ds.queries)), replace=False)
    ]
    golds = [[remap[(q.memory_key, i)] for i in q.gold.evidence_ids] for q in queries]
    out = {"messages": len(merged), "queries": len(queries), "load_1min": load()}
    # faiss HNSW forced (what a >= 50k-message memory uses), and the default at this size (exact flat)
    for faiss_kind, hnsw_min in (("hnsw", 0), ("flat", RetrievalConfig().hnsw_min_messages)):
        mem = TemporalMemory(
            None,
            config=RetrievalConfig(index_min_messages=0, hnsw_min_messages=hnsw_min),
            granularity=ds.granularity,
            cache_elements=0,
        )
        mem.add(merged.messages)
        vectors = mem.state.embed_queries([q.text for q in queries])
        for name in ("none", "oracle"):
            preds = [
                NON_TEMPORAL if name == "none" else WindowPrediction(q.gold.temporal, tuple(q.gold.windows))
                for q in queries
            ]
            searched = (mem, queries, vectors, preds, golds, args.k)
            exact_hits, out[f"{name}_exact"] = timed_searches(*searched, exact=True)
            scores = [exact_scores(mem, q.text, q.asked_at, p, v) for q, v, p in zip(queries, vectors, preds)]
            for depth in [int(d) for d in args.depths.split(",")]:
                mem.config.index_depth = depth
                hits, row = timed_searches(*searched, exact=False)
                same = np.array([compare(a, b, sc) for a, b, sc in zip(hits, exact_hits, scores)], dtype=np.float64)
                row.update(
                    same_top_k_set=round(same[:, 0].mean(), 3),
                    same_top_k_order=round(same[:, 1].mean(), 3),
                    same_top_k_scores=round(same[:, 2].mean(), 3),
                )
                out[f"{name}_{faiss_kind}_index_depth_{depth}"] = row
    return out


def timed_searches(mem, queries, vectors, preds, golds, k: int, exact: bool) -> tuple[list, dict]:
    """Each query searched with its prediction (``exact`` or the index-backed path): the hits,
    and the p50 latency and micro recall@k over ``golds``."""
    from tider.eval.metrics import query_metrics

    hits, times = [], []
    for q, v, p in zip(queries, vectors, preds):
        t0 = time.perf_counter()
        hits.append(mem.search(q.text, asked_at=q.asked_at, windows=p, k=k, query_vector=v, exact=exact))
        times.append(1e3 * (time.perf_counter() - t0))
    scored = [query_metrics(h.positions, g, [k]) for h, g in zip(hits, golds)]
    recall = sum(m[f"hits@{k}"] for m in scored) / max(1, sum(m["n_gold"] for m in scored))  # micro
    return hits, {"p50_ms": round(float(np.percentile(times, 50)), 3), "recall": round(float(recall), 4)}


def markdown(results: dict) -> str:
    """The README tables from a results file (``--table``)."""
    lines = [
        f"Hardware: {results['hardware']}; {results['threads']} thread; dense: {results['dense']}",
        "",
        (
            "| messages | add msg/s | build bm25s / faiss / timeline (s) | RSS MB | store MB | reopen s | "
            "window | exact p50/p95 | index (depth 1000) p50/p95 | same top-20 | index (depth 100) p50/p95 | "
            "same top-20 | bare HNSW top-20 p50 | load |"
        ),
        "|" + "---|" * 14,
    ]
    for r in results["scales"]:
        hnsw = r.get("bare_faiss_hnsw_top20")
        for mode, row in r["search"].items():
            blank = {"p50_ms": float("nan"), "p95_ms": float("nan"), "same_top_k_set": float("nan")}
            d1, d2, ex = row.get("index_depth_1000", blank), row.get("index_depth_100", blank), row["exact"]
            lines.append(
                f"| {r['messages']:,} | {r.get('add_msgs_per_s', '-')} | "
                f"{r['build_bm25_s']:.1f} / {r['build_faiss_s']:.1f} ({r['faiss']}) / {r['build_timeline_s']:.1f} | "
                f"{r['max_rss_mb']:.0f} | {r['store_mb']:.0f} | "
                f"{r['reopen_s']:.1f} | {mode} | {ex['p50_ms']:.1f} / {ex['p95_ms']:.1f} | {d1['p50_ms']:.1f} / "
                f"{d1['p95_ms']:.1f} | {d1['same_top_k_set']:.2f} | {d2['p50_ms']:.1f} / {d2['p95_ms']:.1f} | "
                f"{d2['same_top_k_set']:.2f} | {hnsw['p50_ms'] if hnsw else '-'} | {row['load_1min']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--depths", default="100,1000", help="dense candidate depths of the index-backed path")
    parser.add_argument("--real", action="store_true", help="also the real-vector agreement (embeds ~22k messages)")
    parser.add_argument("--real-only", action="store_true", help="only the real-vector part (--out gets just it)")
    parser.add_argument("--real-queries", type=int, default=300)
    parser.add_argument("--workdir", default="runs/bench_retrieval_stores")
    parser.add_argument("--keep", action="store_true", help="keep the stores")
    parser.add_argument("--reuse", action="store_true", help="search a store an earlier --keep run left (timings only)")
    parser.add_argument("--hnsw-max", type=int, default=10**12, help="sizes above this stay on the flat faiss index")
    parser.add_argument("--out", default="runs/bench_retrieval.json")
    parser.add_argument("--table", default=None, help="print the README table of this results file and exit")
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(Path(args.table).read_text())))
        return

    import faiss

    faiss.omp_set_num_threads(1)
    results = {
        "hardware": hardware(),
        "threads": 1,
        "command": "bench/bench_retrieval.py",
        "dense": f"random unit vectors, dim {args.dim} (not real embeddings)",
        "scales": [],
    }
    for n in [] if args.real_only else [int(s) for s in args.sizes.split(",")]:
        r = run_scale(n, args, np.random.default_rng(n))
        results["scales"].append(r)
        print(json.dumps(r, indent=1), flush=True)
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    if args.real or args.real_only:
        results["real_vectors"] = run_real(args)
        print(json.dumps(results["real_vectors"], indent=1), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
