"""TemporalMemory on PostgreSQL + pgvector, against a real server (pgserver: PostgreSQL 18
with pgvector 0.8, started from a temporary directory; no mock, no skip).

Same answers as the embedded store; adds as transactions (two writers, a SIGKILLed writer);
a schema the code migrates; clear, bounded failure when the database goes away."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from pgtesting import LocalServer, overlap
from test_memory import DIM, T0, NoEmbedder, answers, queries, records

from tider.memory import MemoryInputError, StoreError, TemporalMemory
from tider.memory.pg.config import DatabaseUnavailable, PostgresConfig
from tider.retrieval.config import RetrievalConfig
from tider.types import NON_TEMPORAL, Window, WindowPrediction

TESTS = str(Path(__file__).resolve().parent)


def test_schema_is_created_and_versioned_by_code(postgres):
    import psycopg

    url = postgres.database()
    TemporalMemory(url, name="a", embedder=NoEmbedder()).close()
    TemporalMemory(url, name="b", embedder=NoEmbedder()).close()  # already migrated: nothing applied twice
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM tider_schema").fetchall() == [(1,), (2,), (3,), (4,), (5,), (6,)]
        conn.execute("INSERT INTO tider_schema (version, description) VALUES (99, 'from the future')")
    from tider.memory.pg import pool

    pool._POOLS.clear()  # a new process would open a new pool: it must refuse a schema it does not know
    with pytest.raises(StoreError, match="version 99, this tider knows up to 6: upgrade tider"):
        TemporalMemory(url, name="a", embedder=NoEmbedder())


def test_the_factory_opens_the_backend_its_path_names(postgres, tmp_path):
    """``TemporalMemory`` is a factory (issue 37): a URL opens ``PostgresMemory``, a
    directory or None ``EmbeddedMemory``; both are complete ``MemoryBase``s."""
    from tider.memory import MemoryBase
    from tider.memory.embedded import EmbeddedMemory
    from tider.memory.pg.memory import PostgresMemory

    opened = [
        TemporalMemory(postgres.database(), name="f", embedder=NoEmbedder()),
        TemporalMemory(tmp_path / "f", embedder=NoEmbedder()),
        TemporalMemory(None, embedder=NoEmbedder()),
    ]
    assert [type(m) for m in opened] == [PostgresMemory, EmbeddedMemory, EmbeddedMemory]
    assert all(isinstance(m, MemoryBase) for m in opened)
    assert not PostgresMemory.__abstractmethods__ and not EmbeddedMemory.__abstractmethods__
    for m in opened:
        m.close()


def test_nothing_after_asked_at_and_bad_input(postgres):
    msgs, vecs = records(600)
    mem = TemporalMemory(postgres.database(), name="past", embedder=NoEmbedder())
    with pytest.raises(MemoryInputError) as err:
        mem.add([msgs[0], {"text": "x"}], vectors=vecs[:2])
    assert err.value.field == "messages[1].timestamp" and len(mem) == 0
    with pytest.raises(MemoryInputError, match="vectors"):
        mem.add(msgs[:2], vectors=vecs[:3])
    with pytest.raises(MemoryInputError, match="name"):
        TemporalMemory(postgres.url(), embedder=NoEmbedder())
    mem.add(msgs, vectors=vecs)
    everything = WindowPrediction(True, (Window(T0, T0 + timedelta(days=400)),))
    for text, asked, vec, _ in queries():
        for windows in (NON_TEMPORAL, everything):
            hits = mem.search(text, asked_at=asked, windows=windows, query_vector=vec, k=50)
            assert hits.keys and all(m.timestamp <= asked for m in hits.messages)
            assert [m.id for m in hits.messages] == hits.positions
    assert mem.search("budget", asked_at=T0 - timedelta(days=1), query_vector=vecs[0]).keys == []
    with pytest.raises(StoreError, match="built with embed_template"):
        TemporalMemory(mem.url, name="past", config=RetrievalConfig(embed_template="{text}"), embedder=NoEmbedder())


WRITER = textwrap.dedent("""
    import os, sys, time, numpy as np
    sys.path.insert(0, {tests!r})
    from test_memory import NoEmbedder, records
    from tider.memory import TemporalMemory
    url, name, first, last, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    msgs, vecs = records(2000, seed=3)
    mem = TemporalMemory(url, name=name, embedder=NoEmbedder())
    picks = np.random.default_rng(seed).permutation(np.arange(first, last))
    while not os.path.exists(sys.argv[6]):
        time.sleep(0.01)
    for batch in np.array_split(picks, 25):
        mem.add([msgs[i] for i in batch], vectors=vecs[batch])
    print("done", flush=True)
""")


def test_two_processes_adding_overlapping_batches(postgres, tmp_path):
    """Two writers add 1500 messages each, 1000 of them the same, in 25 adds of random
    times (so positions shift under each other): exactly the 2000 distinct keys remain,
    positions, statistics and timeline as one writer would have left them."""
    import psycopg

    url, go = postgres.database(), tmp_path / "go"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(tests=TESTS))
    procs = [
        subprocess.Popen([sys.executable, str(script), url, "shared", str(a), str(b), str(seed), str(go)], text=True)
        for a, b, seed in ((0, 1500, 1), (500, 2000, 2))
    ]
    time.sleep(3)
    go.touch()
    assert [p.wait(timeout=600) for p in procs] == [0, 0]
    mem = TemporalMemory(url, name="shared", embedder=NoEmbedder())
    msgs, vecs = records(2000, seed=3)
    assert len(mem) == 2000 and sorted(m.key for m in mem.messages()) == sorted(m["key"] for m in msgs)
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT pos, key FROM tider_messages ORDER BY ts, seq").fetchall()
        assert [r[0] for r in rows] == list(range(2000))  # positions dense and in (time, seq) order
        stored = dict(conn.execute("SELECT term, df FROM tider_terms").fetchall())
        counted = dict(conn.execute("SELECT term, count(*) FROM tider_postings GROUP BY term").fetchall())
        assert stored == counted
        n, total = conn.execute("SELECT n_messages, total_length FROM tider_memories").fetchone()
        assert (n, total) == (2000, conn.execute("SELECT sum(doc_length) FROM tider_messages").fetchone()[0])
        by_seq = [int(r[0][1:]) for r in conn.execute("SELECT key FROM tider_messages ORDER BY seq").fetchall()]
    one = TemporalMemory(None, embedder=NoEmbedder())  # the same adds, one writer, in the order they landed
    one.add([msgs[i] for i in by_seq], vectors=vecs[by_seq])
    assert [m.key for m in one.messages()] == [r[1] for r in rows]
    assert one.timeline().starts == mem.timeline().starts
    assert [ids for ids, _ in answers(one, True)] == [ids for ids, _ in answers(mem, True)]


KILLED = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, {tests!r})
    from test_memory import NoEmbedder, records
    from tider.memory import TemporalMemory
    msgs, vecs = records(40 * 250, seed=7)
    mem = TemporalMemory(sys.argv[1], name="killed", embedder=NoEmbedder())
    for b in range(len(mem) // 250, 40):
        mem.add(msgs[b * 250:(b + 1) * 250], vectors=vecs[b * 250:(b + 1) * 250])
        print("added", b, flush=True)
""")


@pytest.mark.parametrize("delay", [0.0, 0.1])
def test_kill_9_of_a_writer_loses_no_acknowledged_add(postgres, tmp_path, delay):
    """A writer adding 250-message batches is SIGKILLed mid-add, twice: every batch whose
    add returned is there, no half batch, positions dense."""
    import psycopg

    url = postgres.database()
    script = tmp_path / "child.py"
    script.write_text(KILLED.format(tests=TESTS))
    for round_ in range(2):
        proc = subprocess.Popen(
            [sys.executable, str(script), url], stdout=subprocess.PIPE, text=True, env={**os.environ}
        )
        returned = -1
        for line in proc.stdout:
            returned = int(line.split()[1])
            if returned >= 2 + 3 * round_:
                break
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        mem = TemporalMemory(url, name="killed", embedder=NoEmbedder())
        n = len(mem)
        assert n % 250 == 0 and n >= 250 * (returned + 1)
        msgs, _ = records(n, seed=7)
        assert sorted(m.key for m in mem.messages()) == sorted(m["key"] for m in msgs[:n])
        with psycopg.connect(url) as conn:
            assert [r[0] for r in conn.execute("SELECT pos FROM tider_messages ORDER BY ts, seq")] == list(range(n))
        mem.close()


def test_the_database_going_away_is_a_clear_bounded_error(tmp_path):
    """The server stops as in a crash: searches and adds fail within the configured wait
    with an error naming the server (not a hang, not a stack of driver errors); /health
    says 503; once it is back everything acknowledged is there and searches work again."""
    from fastapi.testclient import TestClient

    from tider.memory.service import create_app

    own = LocalServer(tmp_path / "data")
    try:
        url, pg = own.database(), PostgresConfig(connect_timeout_s=3)
        msgs, vecs = records(400)
        mem = TemporalMemory(url, name="fragile", embedder=NoEmbedder(), postgres=pg)
        mem.add(msgs, vectors=vecs)
        app = create_app(url, embedder=NoEmbedder(), api_key="k", postgres=pg)
        with TestClient(app) as client:
            assert client.get("/health").json() == {"status": "ok"}
            own.crash()
            t0 = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match="is not reachable .*waited up to 3 s"):
                mem.search("budget", query_vector=vecs[0])
            with pytest.raises(DatabaseUnavailable):
                mem.add(records(401)[0][400:], vectors=records(401)[1][400:])
            assert time.monotonic() - t0 < 30
            down = client.get("/health")
            assert down.status_code == 503 and down.json() == {"status": "unavailable"}
            r = client.post("/memories/fragile/search", json={"text": "budget"}, headers={"Authorization": "Bearer k"})
            assert r.status_code == 503 and "not reachable" in r.json()["detail"]
            own.restart()  # the pool reconnects in the background, with backoff: a probe sees it come back
            deadline = time.monotonic() + 60
            while client.get("/health").status_code != 200:
                assert time.monotonic() < deadline, "the service did not see the database come back"
                time.sleep(0.5)
        assert len(mem) == 400 and mem.search("budget", query_vector=vecs[0], k=5).keys
        mem.close()
    finally:
        own.close()


def test_store_collection_runs_sources_and_rewards_like_the_process(postgres):
    """The harness's store (``MemoryCollection(store=URL)``): every window source predicts
    the same, retrieval returns the same top 20 (but where pgvector's float32 sums and
    numpy's give two dense scores in another order: near ties), the rewards score the
    same; importing twice adds nothing."""
    from tider.data.synth import generate
    from tider.locator.sources import gold_predictions, make_source_from_context
    from tider.memory import MemoryCollection
    from tider.train.rewards import RewardContext

    class HashEmbedder:  # deterministic vectors, same text -> same vector, in every run
        def encode(self, texts):
            seeds = [int(hashlib.sha1(t.encode()).hexdigest()[:8], 16) for t in texts]
            out = [np.random.default_rng(seed).normal(size=DIM) for seed in seeds]
            return np.array([v / np.linalg.norm(v) for v in out], dtype=np.float32).reshape(-1, DIM)

    data = generate(300, seed=5, n_conversations=2)
    url, emb = postgres.database(), HashEmbedder()
    local = MemoryCollection(data.memories, embedder=emb)
    stored = MemoryCollection(data.memories, embedder=emb, store=url)
    again = MemoryCollection(data.memories, embedder=emb, store=url)
    queries_ = [q for q in data.queries if q.gold.evidence_ids][:30]
    context = {"gold_by_key": gold_predictions(queries_), "source_options": {}}
    same = []
    for name in ("none", "rules", "timeline", "dbscan-tuned", "top-day", "top-days", "oracle"):
        for q in queries_:
            a = make_source_from_context(name, {**context, "store": local}).predict(q.public(), local)
            b = make_source_from_context(name, {**context, "store": stored}).predict(q.public(), stored)
            assert a == b, (name, q.key)
            want, got = local.retrieve(q.public(), a, 20)[0].tolist(), again.retrieve(q.public(), b, 20)[0].tolist()
            same.append(want == got)
            assert overlap(want, got) >= 0.9, (name, q.key, want, got)
    assert np.mean(same) >= 0.9
    rewards = [RewardContext(dataset=data, store=s) for s in (local, stored)]
    q = queries_[0]
    assert rewards[0].coverage("t", q.key, NON_TEMPORAL, q.gold.evidence_ids) == rewards[1].coverage(
        "t", q.key, NON_TEMPORAL, q.gold.evidence_ids
    )


def _serve(url: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "TIDER_API_KEY": "secret", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "tider.cli", "memory", "serve", "--store", url, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_services_share_one_memory(postgres):
    """Two ``tider memory serve --store URL`` processes (replicas behind a load balancer):
    an add through either is found through the other; /health answers a keyless probe and
    says nothing but up; the list of memories needs the key."""
    import httpx
    from test_memory_service import MESSAGES

    from tider.llm.vllm_server import free_port

    url, auth = postgres.database(), {"Authorization": "Bearer secret"}
    ports = [free_port(), free_port()]
    procs = [_serve(url, p) for p in ports]
    a, b = (f"http://127.0.0.1:{p}" for p in ports)
    try:
        deadline = time.monotonic() + 120
        for base, proc in zip((a, b), procs):
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "service did not come up"
                time.sleep(0.3)
        assert httpx.get(f"{b}/health").json() == {"status": "ok"}
        assert httpx.get(f"{a}/memories").status_code == 401
        r = httpx.post(f"{a}/memories/team/messages", json={"messages": MESSAGES[:3]}, headers=auth, timeout=120)
        assert r.status_code == 200 and r.json() == {"keys": ["m1", "m2", "m3"]}
        found = httpx.post(
            f"{b}/memories/team/search", json={"text": "offsite", "k": 5}, headers=auth, timeout=120
        ).json()
        assert {h["key"] for h in found["hits"]} == {"m1", "m2", "m3"}
        r = httpx.post(f"{b}/memories/team/messages", json={"messages": MESSAGES}, headers=auth, timeout=120)
        assert r.status_code == 200 and r.json()["keys"] == ["m1", "m2", "m3", "m4"]  # three were there: no-ops
        found = httpx.post(f"{a}/memories/team/search", json={"text": "Porto vote", "k": 1}, headers=auth, timeout=60)
        assert [h["key"] for h in found.json()["hits"]] == ["m4"]
        assert httpx.get(f"{b}/memories", headers=auth).json() == {"memories": ["team"]}
        assert httpx.get(f"{a}/health", headers=auth).json() == {"status": "ok"}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def test_memory_import_into_a_database_then_search(postgres, tmp_path):
    """``tider memory import --out URL``: one memory per conversation in the database; a
    second run adds nothing (keys are unique per memory); the memories open by name."""
    from tider.cli import main
    from tider.data.synth import generate, write
    from tider.memory.backends import open_backend

    write(generate(240, seed=5, n_conversations=2), str(tmp_path / "data"))
    url = postgres.database()
    args = ["memory", "import", "--dataset", "synthetic", "--path", str(tmp_path / "data"), "--out", url]
    assert main(args) == 0
    assert main(args) == 0  # resumable: re-adding a key is a no-op
    backend = open_backend(url)
    try:
        names = backend.names()
        assert len(names) == 2
        for name in names:
            with backend.open(name) as mem:
                assert len(mem) == 120  # 240 messages over two conversations, none twice
        with backend.open(names[0]) as mem:
            assert mem.search("status update", k=3).keys
    finally:
        backend.close()


# -- record management (issue 36) -------------------------------------------------------------
def test_the_day_a_question_names_leads_under_rules_as_embedded(postgres):
    """Issue 45 item 6 on PostgreSQL: a padded window's anchor ranks as in the embedded store."""
    from test_retrieval_anchor import ASKED, recurring

    msgs, vecs, qvec = recurring()
    pg = TemporalMemory(postgres.database(), name="anchor", embedder=NoEmbedder())
    local = TemporalMemory(None, embedder=NoEmbedder())
    for mem in (pg, local):
        mem.add(msgs, vectors=vecs)
    got = [
        mem.search(ASKED, asked_at=datetime(2024, 2, 20), windows="rules", k=5, query_vector=qvec, exact=True)
        for mem in (pg, local)
    ]
    assert got[0].keys == got[1].keys and got[0].messages[0].timestamp.date() == datetime(2024, 2, 3).date()
    pg.close()
