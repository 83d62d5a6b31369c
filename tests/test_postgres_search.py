"""Search on PostgreSQL + pgvector against a real server (pgserver; no mock, no skip): the
same answers as the embedded store on the exact path, agreement on the HNSW path, the
lexical list beside the walk in the search's snapshot, and BM25 in SQL exact with a
frequent term set aside. (Schema, writes and failures: tests/test_memory_postgres.py.)"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from pgtesting import overlap
from test_memory import DIM, T0, NoEmbedder, answers, queries, records

from tider.memory import TemporalMemory
from tider.memory.pg.config import PostgresConfig
from tider.retrieval.config import RetrievalConfig


def test_answers_equal_the_embedded_store(postgres):
    """3000 messages in three adds, the last older than the rest (positions renumbered):
    same order, same timeline, same answers and scores on the exact path."""
    msgs, vecs = records(3000)
    embedded = TemporalMemory(None, embedder=NoEmbedder())
    embedded.add(msgs, vectors=vecs)
    mem = TemporalMemory(postgres.database(), name="team", embedder=NoEmbedder())
    by_time = np.argsort([m["timestamp"] for m in msgs], kind="stable")
    late, early = by_time[1000:], by_time[:1000]
    mem.add([msgs[i] for i in sorted(late[:1000])], vectors=vecs[sorted(late[:1000])])
    mem.add([msgs[i] for i in sorted(late[1000:])], vectors=vecs[sorted(late[1000:])])
    mem.add([msgs[i] for i in sorted(early)], vectors=vecs[sorted(early)])  # older than everything stored
    # equal timestamps keep the order of addition; here it differs from the one-add order only there
    assert len(mem) == 3000 and sorted(m.key for m in mem.messages()) == sorted(m.key for m in embedded.messages())
    reference = TemporalMemory(None, embedder=NoEmbedder())
    order = [int(k[1:]) for k in (m.key for m in mem.messages())]
    reference.add([msgs[i] for i in order], vectors=vecs[order])
    assert [m.key for m in reference.messages()] == [m.key for m in mem.messages()]
    got, want = answers(mem, exact=True), answers(reference, exact=True)
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    assert np.allclose([s for _, s in got], [s for _, s in want], atol=1e-6)
    a, b = mem.timeline(), reference.timeline()
    assert a.starts == b.starts and np.allclose(a.vectors, b.vectors, atol=1e-6)
    assert mem.add(msgs[:10], vectors=vecs[:10]) == [m["key"] for m in msgs[:10]] and len(mem) == 3000  # no-ops
    mem.close()


def test_hnsw_path_is_used_and_agrees(postgres):
    """Forced HNSW (``hnsw_min_messages=0``): the planner walks the memory's index; its
    top 10 overlaps the embedded store's at the same dense depth (``hnsw_depth``, 200 by
    default, ``index_depth`` there) and, 1000 deep, the exact one, on 90% or more. (These
    messages draw 6 words from 14, so BM25 ties everywhere and deep dense ranks decide: the
    depth shows here as it does not on LoCoMo, tests/test_postgres_parity.py.)"""
    import psycopg

    from tider.memory.pg import rank as sql

    msgs, vecs = records(3000)
    exact = TemporalMemory(None, embedder=NoEmbedder())
    exact.add(msgs, vectors=vecs)
    depth = PostgresConfig().hnsw_depth
    same_depth = RetrievalConfig(index_min_messages=0, index_depth=depth)
    shallow = TemporalMemory(None, config=same_depth, embedder=NoEmbedder())
    shallow.add(msgs, vectors=vecs)
    url, forced = postgres.database(), RetrievalConfig(hnsw_min_messages=0)
    mem = TemporalMemory(url, name="big", config=forced, embedder=NoEmbedder())
    mem.add(msgs, vectors=vecs)
    deep = TemporalMemory(url, name="big", embedder=NoEmbedder(), postgres=PostgresConfig(hnsw_depth=1000))
    hits = mem.search("budget", query_vector=vecs[0], k=5)
    assert hits.exact is False and mem.search("budget", query_vector=vecs[0], k=5, exact=True).exact
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        row = sql.MemoryRow.read(conn, "big")
        conn.execute("SET LOCAL enable_sort = off")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN " + sql.dense_sql(row, True),
                {"q": str(vecs[0].tolist()), "m": row.id, "asked": T0 + timedelta(days=200), "depth": depth},
            )
        )
    assert f"tider_hnsw_{row.id}" in plan, plan
    for got, want in ((answers(mem, False), answers(shallow, False)), (answers(deep, False), answers(exact, True))):
        assert np.mean([overlap(g, w) for (g, _), (w, _) in zip(got, want)]) >= 0.9


def test_lexical_list_beside_the_walk_reads_the_search_snapshot(postgres):
    """On the HNSW path the lexical list runs on a second pooled connection that imports
    the search's snapshot: an add committed after the search began is seen by neither
    connection, and both lists are those of a one-connection search."""
    from tider.memory.pg import rank as sql

    msgs, vecs = records(1200)
    url, forced = postgres.database(), RetrievalConfig(hnsw_min_messages=0)
    mem = TemporalMemory(url, name="side", config=forced, embedder=NoEmbedder())
    mem.add(msgs[:1000], vectors=vecs[:1000])
    writer = TemporalMemory(url, name="side", embedder=NoEmbedder())
    text, asked, vec, _ = queries()[1]
    with mem._read() as snap:
        writer.add(msgs[1000:], vectors=vecs[1000:])  # committed mid-search
        cut = sql.cut_at(snap.conn, snap.row, asked)
        with mem._side(snap, True) as side:
            assert side is not None  # the pool grows to give one
            count = "SELECT count(*) FROM tider_messages WHERE memory_id = %s"
            assert side(lambda conn: conn.execute(count, (snap.row.id,)).fetchone()[0]) == 1000
            args = (snap.row, text, vec, "hybrid", cut, asked, True, mem.config, mem.pg)
            both = sql.candidates(snap.conn, *args, side=side)
        alone = sql.candidates(snap.conn, *args)
    assert len(writer) == 1200
    assert np.array_equal(both.ids, alone.ids) and np.array_equal(both.sim, alone.sim)
    mem.close(), writer.close()


@pytest.mark.parametrize("depth", [50, 400])
def test_bm25_with_a_frequent_term_set_aside_is_exact(postgres, depth):
    """Above ``index_min_messages`` the lexical list sets a frequent query term (a speaker's
    name) aside: it must be the list of scoring every posting, to the bit (a reference in
    double precision here), whether the other terms fill it (depth 50) or the set-aside
    term's own postings must (depth 400)."""
    from collections import Counter

    from tider.memory.pg import lexical
    from tider.memory.pg import rank as sql
    from tider.retrieval.bm25 import expand_message

    mem_analysis = RetrievalConfig().lexical()  # the memory's analysis: stems
    tokenize = mem_analysis.terms
    rng = np.random.default_rng(5)
    words = [f"w{i}" for i in range(400)]
    p = 1 / np.arange(1, 401)
    msgs = [
        {
            "key": f"k{i}",
            "text": " ".join(rng.choice(words, size=int(rng.integers(3, 12)), p=p / p.sum())),
            "timestamp": (T0 + timedelta(hours=i)).isoformat(),
            "speaker": ["maria", "joanna"][i % 2],
        }
        for i in range(3000)
    ]
    vecs = rng.normal(size=(3000, DIM)).astype(np.float32)
    mem = TemporalMemory(postgres.database(), name="names", embedder=NoEmbedder())
    mem.add(msgs, vectors=vecs)
    docs = [Counter(tokenize(expand_message(m))) for m in mem.messages()]
    n, avgdl = len(docs), sum(max(sum(d.values()), 1) for d in docs) / len(docs)
    for text in ("what did joanna say about w3 w40", "joanna w250 w311", "maria w1 w2 w7 joanna", "w5"):
        cut, asked = 2000, T0 + timedelta(hours=1999)
        with mem._read() as snap:
            row = snap.row
            assert sql.cut_at(snap.conn, row, asked) == cut
            got = lexical.bm25_list(
                snap.conn, row.id, text, row.n, row.total_length, asked, cut, depth, 0, mem_analysis
            )
        q = Counter(tokenize(text))
        df = {t: sum(t in d for d in docs) for t in q}
        scores = []
        for d in docs[:cut]:
            parts = []
            for t in q:
                if d[t]:
                    idf = float(np.float32(np.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))))
                    tfc = d[t] / (d[t] + 1.5 * (0.25 + 0.75 * max(sum(d.values()), 1) / avgdl))
                    parts.append(float(np.float32(idf * q[t] * tfc)))
            scores.append(float(np.float32(sum(parts))) if parts else 0.0)
        want = sorted((i for i in range(cut) if scores[i] > 0), key=lambda i: (-scores[i], i))[:depth]
        assert got.pos.tolist() == want, text
        assert np.array_equal(got.scores, np.array([scores[i] for i in want], dtype=np.float32)), text


def test_a_query_sharing_no_term_ranks_by_the_dense_channel(postgres):
    """No past message shares a term with the query: the lexical list is empty and the
    fusion runs on the dense list alone, on the index path and in the database alike."""
    msgs, vecs = records(1500)
    exact = TemporalMemory(None, embedder=NoEmbedder())
    index = TemporalMemory(None, config=RetrievalConfig(index_min_messages=0, index_depth=200), embedder=NoEmbedder())
    mem = TemporalMemory(postgres.database(), name="noterm", embedder=NoEmbedder())
    for m in (exact, index, mem):
        m.add(msgs, vectors=vecs)
    want = exact.search("zzz qqq", query_vector=vecs[3], k=10)
    assert want.keys and want.keys == index.search("zzz qqq", query_vector=vecs[3], k=10, exact=False).keys
    assert mem.search("zzz qqq", query_vector=vecs[3], k=10).keys == want.keys
