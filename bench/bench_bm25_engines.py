"""Is bm25s the bottleneck of the index-backed path? bm25s against tantivy (a maintained
Rust engine with block-max WAND top-k and segment appends), same corpus, same tokens,
same queries, one thread: index build, top-k latency (k = 20 and 1000, the RRF depth),
and how often both return the same top-20 set.

tantivy is not a tider dependency (``pip install tantivy==0.27.0`` to run this). Its BM25
has k1 = 1.2 fixed while bm25s (and so the exact path) uses k1 = 1.5, which is one reason
the rankings differ.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_bm25_engines.py --sizes 100000,1000000
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from benchlib import load


def tantivy_index(token_lists):
    import tantivy

    builder = tantivy.SchemaBuilder()
    builder.add_text_field("body", tokenizer_name="whitespace", index_option="freq")
    builder.add_integer_field("row", fast=True, indexed=False)
    schema = builder.build()
    index = tantivy.Index(schema, path=tempfile.mkdtemp(prefix="tantivy-"))
    writer = index.writer(200_000_000, 1)
    for i, tokens in enumerate(token_lists):
        writer.add_document(tantivy.Document(body=" ".join(tokens), row=i))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return schema, index.searcher()


def tantivy_top(schema, searcher, tokens, k):
    import tantivy

    query = tantivy.Query.boolean_query(
        [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "body", t)) for t in tokens]
    )
    hits = searcher.search(query, k, count=False).hits
    return searcher.fast_field_values("row", [a for _, a in hits])


def main() -> None:
    from tider.retrieval.bm25 import BM25Index, tokenize

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--queries", type=int, default=50)
    args = parser.parse_args()
    out = []
    for n in [int(s) for s in args.sizes.split(",")]:
        rng = np.random.default_rng(n)
        ranks = np.minimum(rng.zipf(1.3, size=(n, 12)), 50_000) - 1  # the corpus of bench_retrieval.py
        texts = [" ".join(f"w{r}" for r in row) for row in ranks]
        queries = [
            tokenize(" ".join(f"w{r}" for r in np.minimum(rng.zipf(1.3, size=4), 50_000) - 1))
            for _ in range(args.queries)
        ]
        t0 = time.perf_counter()
        bm25 = BM25Index.from_texts(texts)
        row = {"messages": n, "build_bm25s_s": round(time.perf_counter() - t0, 1)}
        t0 = time.perf_counter()
        schema, searcher = tantivy_index(bm25.token_lists)
        row["build_tantivy_s"] = round(time.perf_counter() - t0, 1)
        for k in (20, 1000):
            for name, fn in (
                ("bm25s", lambda q, bm25=bm25, k=k: bm25.search(q, k)),
                ("tantivy", lambda q, schema=schema, searcher=searcher, k=k: tantivy_top(schema, searcher, q, k)),
            ):
                times = []
                for q in queries:
                    t0 = time.perf_counter()
                    fn(q)
                    times.append(1e3 * (time.perf_counter() - t0))
                row[f"{name}_top{k}_p50_ms"] = round(float(np.percentile(times, 50)), 2)
        row["same_top20_set"] = round(
            float(
                np.mean(
                    [set(bm25.search(q, 20)[0].tolist()) == set(tantivy_top(schema, searcher, q, 20)) for q in queries]
                )
            ),
            3,
        )
        row["load_1min"] = load()
        print(json.dumps(row), flush=True)
        out.append(row)


if __name__ == "__main__":
    main()
