"""`tider eval retrieval` through PostgreSQL against the embedded store, on LoCoMo dev and
on the synthetic benchmark (real MiniLM embeddings, a real postgres): the exact path and
the HNSW path (forced: these memories are below the index threshold). LoCoMo: three of its
seven conversations (356 of the 1,035 questions evaluated, category 5 left out by default):
embedding all seven cold costs CI about two minutes and tests no other path.

Must hold: recall@20 within 0.01 of the embedded figures, and the per-query top 20
overlapping the embedded one on 90% or more, for windows ``none`` and ``rules``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pgtesting import overlap

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

LOCOMO = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "locomo" / "locomo_dev.json"
LOCOMO_SUBSET = "conv-26,conv-30,conv-44"
METHODS = ("none", "rules")


def evaluate(dataset: str, path: str, out: Path, *extra: str) -> tuple[dict, dict]:
    """``({method: recall@20}, {method: {query key: top-20 positions}})`` of one run."""
    from tider.cli import main

    args = ["eval", "retrieval", "--dataset", dataset, "--path", path, "--windows", ",".join(METHODS)]
    assert main([*args, "--k", "20", "--out", str(out), *extra]) == 0
    report = json.loads((out / "report.json").read_text())
    ids = {
        m: {r["key"]: r["record"]["ids"] for r in map(json.loads, (out / f"retrieve-{m}.jsonl").open())}
        for m in METHODS
    }
    return {m: report["methods"][m]["recall@20"] for m in METHODS}, ids


def compare_backends(postgres, dataset: str, path: str, tmp_path: Path, *extra: str) -> dict:
    """The embedded run against PostgreSQL exact and PostgreSQL HNSW (forced)."""
    recall, ids = evaluate(dataset, path, tmp_path / "embedded", *extra)
    (tmp_path / "hnsw.yaml").write_text("hnsw_min_messages: 0\n")
    runs = {
        "exact": evaluate(dataset, path, tmp_path / "pg", "--store", postgres.database(), *extra),
        "hnsw": evaluate(
            dataset,
            path,
            tmp_path / "pgh",
            "--store",
            postgres.database(),
            "--config",
            str(tmp_path / "hnsw.yaml"),
            *extra,
        ),
    }
    out = {}
    for path_name, (pg_recall, pg_ids) in runs.items():
        for m in METHODS:
            agree = np.mean([overlap(ids[m][k], pg_ids[m][k]) for k in ids[m]])
            out[(path_name, m)] = (recall[m], pg_recall[m], agree)
            assert abs(pg_recall[m] - recall[m]) <= 0.01, (path_name, m, recall[m], pg_recall[m])
            assert agree >= 0.9, (path_name, m, agree)
    return out


@pytest.mark.skipif(not LOCOMO.is_file(), reason=f"needs LoCoMo dev at {LOCOMO} (read at run time)")
def test_locomo_dev_through_postgres_matches_the_embedded_store(postgres, tmp_path):
    figures = compare_backends(postgres, "locomo", str(LOCOMO), tmp_path, "--memories", LOCOMO_SUBSET)
    # Complete candidate lists on the exact path: the same top 20, query for query.
    assert all(figures[("exact", m)][2] == 1.0 for m in METHODS), figures


def test_synthetic_benchmark_through_postgres_matches_the_embedded_store(postgres, tmp_path):
    from tider.data.synth import generate, write

    write(generate(2400, seed=11, n_conversations=2), str(tmp_path / "data"))
    compare_backends(postgres, "synthetic", str(tmp_path / "data"), tmp_path)
