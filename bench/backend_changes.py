"""``bench/bench_backends.py``'s change phase: one message added, updated, deleted (a newest
and an oldest), each followed by a search, timed in the process that searches; and the
table row that sets each change against an add and the search after an add against a plain
search (issue 44: a change at most 10x an add, the search after an add at most 2x)."""

from __future__ import annotations

import functools
import time
from datetime import datetime, timedelta

import numpy as np

from tider.memory.files import StoreError


def latency(times: list[float]) -> dict:
    return {"p50_ms": round(float(np.percentile(times, 50)), 2), "p95_ms": round(float(np.percentile(times, 95)), 2)}


def change_phase(mem, n: int, queries: list[dict], rounds: int, dim: int, t0: datetime) -> dict:
    """``rounds`` rounds of: add one message after the newest, then search (what an agent
    does next); update one old message's text, search; delete one of the newest, search;
    delete one of the oldest (before sparse positions and lazy renumbering, every later
    position moved), search. Each round's search is compared with the plain search p50 of
    the same process; ``dim``: the corpus's vector dimension, ``t0`` its first day."""
    rng = np.random.default_rng(7)
    rows: dict[str, list[float]] = {"add": [], "search_after_add": [], "update": [], "search_after_update": []}
    rows.update(delete=[], search_after_delete=[], delete_oldest=[], search_after_delete_oldest=[])
    failed: dict[str, str] = {}
    for i in range(rounds):
        q = queries[i % len(queries)]
        vec = rng.normal(size=(1, dim)).astype(np.float32)
        now = t0 + timedelta(days=3 * 365, minutes=i)  # an agent adds what just happened
        new = {"key": f"new-{i}", "text": f"w{100 + i} w{200 + i} fresh", "timestamp": now.isoformat()}
        vec = vec / np.linalg.norm(vec)
        changes = (  # each round updates and deletes other messages of the corpus
            ("add", functools.partial(mem.add, [new], vectors=vec)),
            ("update", functools.partial(mem.update, str(7 * i), text=f"w{300 + i} changed")),
            ("delete", functools.partial(mem.delete, [str(n - 1 - 7 * i)])),
            ("delete_oldest", functools.partial(mem.delete, [str(7 * i + 3)])),
        )
        for kind, change in changes:
            if kind in failed:  # once a statement timeout: the same change again would be one too
                continue
            t = time.perf_counter()
            try:
                change()
            except StoreError as err:  # e.g. PostgreSQL's statement timeout: what a user gets (503)
                failed[kind] = f"after {time.perf_counter() - t:.0f} s: {str(err)[-160:]}"
                continue
            rows[kind].append(1e3 * (time.perf_counter() - t))
            t = time.perf_counter()
            mem.search(q["text"], asked_at=q["asked_at"], windows="none", query_vector=q["vector"], k=20)
            rows[f"search_after_{kind}"].append(1e3 * (time.perf_counter() - t))
    return {k: latency(v) if v else {"failed": failed.get(k.removeprefix("search_after_"))} for k, v in rows.items()}


CHANGE_HEADER = (
    "| messages | backend | add one, p50 (ms) | search right after, p50 (ms) / plain search p50 "
    "| update one, p50 (ms) / add | delete one, p50 (ms) / add | delete an oldest, p50 (ms) / add "
    "| search after an update / delete, p50 (ms) |"
)


def change_row(n: int, backend: str, r: dict) -> str:
    c, plain = r["changes"], r["none"]["p50_ms"]
    add = c["add"]["p50_ms"]

    def cost(kind: str, per: float, digits: int = 1) -> str:  # a failed change (statement timeout): its error
        row = c[kind]
        return (
            f"failed {row['failed'].split(':')[0]}"
            if "failed" in row
            else f"{row['p50_ms']} / {row['p50_ms'] / per:.{digits}f}x"
        )

    return (
        f"| {n:,} | {backend} | {add} | {cost('search_after_add', plain, 2)} | "
        f"{cost('update', add)} | {cost('delete', add)} | {cost('delete_oldest', add)} | "
        f"{c['search_after_update'].get('p50_ms')} / {c['search_after_delete'].get('p50_ms')} |"
    )
