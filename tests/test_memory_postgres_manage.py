"""Record management on PostgreSQL (issue 36, 44): update, delete, delete_all as
transactions, against a real server. A managed memory answers as one built from its
surviving messages (positions, postings, statistics, timeline), with and without HNSW and
under concurrent adds and searches; its deleted text leaves the tables after VACUUM FULL.
(Adds, schema and failures: tests/test_memory_postgres.py; the embedded store:
tests/test_memory_manage.py.)"""

from __future__ import annotations

import hashlib
import threading
from datetime import datetime, timedelta

import numpy as np
import pytest
from test_memory import DIM, T0, NoEmbedder, answers, queries, records

from tider.memory import MemoryInputError, TemporalMemory
from tider.retrieval.config import RetrievalConfig


class HashVectors:
    """Deterministic vectors (same text, same vector) of the test's dimension: an embedder
    for updates of text without a model."""

    model_name = "hash-vectors"

    def encode(self, texts):
        seeds = [int(hashlib.sha1(t.encode()).hexdigest()[:8], 16) for t in texts]
        out = np.array([np.random.default_rng(seed).normal(size=DIM) for seed in seeds], dtype=np.float32)
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).reshape(-1, DIM)


def check_tables(url: str, name: str) -> None:
    """Stored positions increasing in (time, seq) order, and with the gaps exactly
    0 .. span-1 (the memory row counting the gaps); every timeline start a message's;
    every posting's message there with its position and time; document frequencies and
    corpus statistics as counted."""
    import psycopg

    with psycopg.connect(url) as conn:
        (mid,) = conn.execute("SELECT id FROM tider_memories WHERE name = %s", (name,)).fetchone()
        pos = [
            r[0] for r in conn.execute("SELECT pos FROM tider_messages WHERE memory_id = %s ORDER BY ts, seq", (mid,))
        ]
        assert pos == sorted(set(pos))
        gaps = [r[0] for r in conn.execute("SELECT pos FROM tider_gaps WHERE memory_id = %s", (mid,))]
        assert sorted(pos + gaps) == list(range(len(pos) + len(gaps)))
        assert conn.execute("SELECT gaps FROM tider_memories WHERE id = %s", (mid,)).fetchone()[0] == len(gaps)
        starts = [r[0] for r in conn.execute("SELECT start_pos FROM tider_timeline WHERE memory_id = %s", (mid,))]
        assert set(starts) <= set(pos)
        stray = conn.execute(
            "SELECT count(*) FROM tider_postings p LEFT JOIN tider_messages m ON m.memory_id = p.memory_id "
            "AND m.seq = p.seq WHERE p.memory_id = %s AND (m.seq IS NULL OR m.pos <> p.pos OR m.ts <> p.ts "
            "OR m.doc_length <> p.doc_length)",
            (mid,),
        ).fetchone()[0]
        assert stray == 0
        stored = dict(conn.execute("SELECT term, df FROM tider_terms WHERE memory_id = %s", (mid,)).fetchall())
        counted = conn.execute("SELECT term, count(*) FROM tider_postings WHERE memory_id = %s GROUP BY term", (mid,))
        assert stored == dict(counted.fetchall())
        n, total, max_ts = conn.execute(
            "SELECT n_messages, total_length, max_ts FROM tider_memories WHERE id = %s", (mid,)
        ).fetchone()
        assert (n, total, max_ts) == conn.execute(
            "SELECT count(*), coalesce(sum(doc_length), 0), max(ts) FROM tider_messages WHERE memory_id = %s", (mid,)
        ).fetchone()


def vacuumed_files(server, url: str) -> bytes:
    """The bytes of tider's tables, their indexes and TOAST after ``VACUUM FULL`` and a
    checkpoint: what a deleted text leaves on disk (manage's docstring)."""
    import psycopg

    tables = ("tider_messages", "tider_postings", "tider_terms", "tider_chunks", "tider_timeline")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"VACUUM FULL {', '.join(tables)}")
        conn.execute("CHECKPOINT")
        paths = conn.execute(
            "SELECT pg_relation_filepath(c.oid) FROM pg_class c WHERE c.relname = ANY(%s) "
            "OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = ANY(%s::regclass[])) "
            "OR c.oid IN (SELECT reltoastrelid FROM pg_class WHERE relname = ANY(%s))",
            (list(tables), list(tables), list(tables)),
        ).fetchall()
    files = [f for (p,) in paths if p for f in server.pgdata.glob(p + "*")]
    assert len(files) >= len(tables)
    return b"".join(f.read_bytes() for f in files)


def test_update_then_delete_on_postgres(postgres):
    """add, get, update the text (search finds the new one, not the old), delete (neither
    search nor get finds it); another process's memory sees each change on its next read;
    the deleted text is in no row, and after VACUUM FULL in none of the tables' files."""
    import psycopg

    msgs, _ = records(40)
    msgs[7]["text"] = "we booked the zeppelin tour for the offsite"
    url, config = postgres.database(), RetrievalConfig(semantic="bm25")
    mem = TemporalMemory(url, name="chat", config=config, embedder=HashVectors())
    other = TemporalMemory(url, name="chat", config=config, embedder=HashVectors())  # another reader, own copy
    assert mem.get("m7") is None and mem.delete("m7") == [] and mem.delete_all() == []  # no memory yet
    mem.add(msgs)
    assert mem.get("m7").text == msgs[7]["text"] and mem.get("nope") is None
    assert mem.search("zeppelin", k=1).keys == ["m7"] and other.get("m7").text == msgs[7]["text"]
    assert len(other.timeline().starts) and other.search("zeppelin", k=1).keys == ["m7"]

    stored = mem.update("m7", text="we booked the kayak tour for the offsite")
    assert stored.key == "m7" and stored.text.startswith("we booked the kayak") and len(mem) == 40
    assert stored == mem.get("m7") == other.get("m7") and stored.id == mem.messages().id_of("m7")
    vector = HashVectors().encode(["u1: we booked the kayak tour for the offsite"])[0]
    for m in (mem, other):
        assert m.search("kayak", k=1).keys == ["m7"]
        assert all("zeppelin" not in h.text for h in m.search("zeppelin", k=40).messages)
        assert m.search("x", k=1, semantic="dense", query_vector=vector).keys == ["m7"]  # re-embedded
        assert m.search("kayak", k=1, semantic="hybrid", query_vector=vector).keys == ["m7"]
    with pytest.raises(MemoryInputError):
        mem.update("m7")
    from tider.memory.records import MessageNotFound

    with pytest.raises(MessageNotFound):
        mem.update("nope", text="x")

    on_disk = vacuumed_files(postgres, url)
    assert b"kayak" in on_disk and b"zeppelin" not in on_disk  # the updated text's old version is gone too
    assert mem.delete(["m7", "not-there", "m7"]) == ["m7"] and len(mem) == 39
    for m in (mem, other):
        assert len(m) == 39 and m.get("m7") is None and "m7" not in m.search("kayak", k=39).keys
        assert "m7" not in {x.key for x in m.messages()} and len(m.messages()) == 39
    with pytest.raises(MessageNotFound):
        mem.update("m7", text="back")
    check_tables(url, "chat")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM tider_messages WHERE text LIKE '%%kayak%%'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM tider_terms WHERE term LIKE 'kayak%%'").fetchone()[0] == 0
    assert b"kayak" not in vacuumed_files(postgres, url)
    left = [m.key for m in mem.messages()]
    assert mem.delete_all() == left and len(left) == 39
    assert len(mem) == 0 and len(other) == 0 and other.messages().messages == [] and mem.search("offsite").keys == []
    mem.add(msgs[:3])  # an emptied memory takes adds again
    assert len(other) == 3 and [m.key for m in other.messages()] == [m.key for m in mem.messages()]
    check_tables(url, "chat")
    mem.close()
    other.close()


def _answers(mem, exact: bool = True) -> list:
    out = answers(mem, exact)
    out += [
        (h.keys, h.scores)
        for text, asked, vec, win in queries(6, seed=4)
        for semantic in ("bm25", "dense")
        for h in [mem.search(text, asked_at=asked, windows=win, query_vector=vec, k=25, semantic=semantic)]
    ]
    return out


def test_a_managed_postgres_memory_answers_as_one_built_from_its_survivors(postgres):
    """Deletes (keys, a time range), updates (times moved back, forward and within equal
    times; texts, re-embedded), out-of-order adds in between: search (every channel, with
    and without windows, past cut), len, messages and timeline equal those of a fresh
    memory given the surviving messages in their insertion order; another process's copy,
    read before the changes, follows."""
    from tider.retrieval.embed import embedding_text
    from tider.types import Message

    msgs, vecs = records(900)
    by_time = list(np.argsort([m["timestamp"] for m in msgs], kind="stable"))
    order = sorted(by_time[:700]) + sorted(by_time[700:], key=lambda i: msgs[i]["timestamp"], reverse=True)
    url, emb = postgres.database(), HashVectors()
    mem = TemporalMemory(url, name="managed", embedder=emb)
    other = TemporalMemory(url, name="managed", embedder=emb)
    first, later = order[:600], order[600:]
    mem.add([msgs[i] for i in first], vectors=vecs[first])
    _answers(mem), other.messages(), other.timeline()  # copies and caches exist before anything changes

    dropped = {f"m{i}" for i in range(0, 900, 7)}
    assert sorted(mem.delete(sorted(dropped))) == sorted(k for k in dropped if int(k[1:]) in set(first))
    mem.add([msgs[i] for i in later], vectors=vecs[later])  # out of order, after a delete
    assert sorted(mem.delete(sorted(dropped))) == sorted(k for k in dropped if int(k[1:]) in set(later))
    other.messages(), other.timeline()

    moved = {
        "m3": T0 - timedelta(days=5),  # older than all
        "m500": T0 + timedelta(days=150),  # mid-memory
        "m11": T0 + timedelta(days=400),  # the newest
        "m12": datetime.fromisoformat(msgs[13]["timestamp"]),  # onto another's time: seq breaks the tie
    }
    for key, when in moved.items():
        assert mem.update(key, timestamp=when).timestamp == when  # the same text: no embedding
    texts = {"m22": "the zeppelin tour is booked", "m23": "roadmap vote moved"}
    for key, text in texts.items():
        assert mem.update(key, text=text).text == text
    moved["m23"] = T0 + timedelta(days=2)
    assert mem.update("m23", text=texts["m23"], timestamp=moved["m23"]).timestamp == moved["m23"]
    assert mem.get("m24") == mem.update("m24", text=msgs[24]["text"])  # no change: nothing written
    lo, hi = T0 + timedelta(days=200), T0 + timedelta(days=210)
    in_range = [m.key for m in mem.get_all(lo, hi, limit=10_000)]
    assert in_range and mem.delete_all(lo, hi) == in_range
    page = mem.get_all(lo - timedelta(days=30), hi, offset=5, limit=7)
    assert [m.key for m in page] == [m.key for m in mem.get_all(lo - timedelta(days=30), hi, limit=10_000)[5:12]]

    gone = dropped | set(in_range)
    keep = [i for i in order if f"m{i}" not in gone]
    survivors = []
    for i in keep:
        m = dict(msgs[i])
        if f"m{i}" in moved:
            m["timestamp"] = moved[f"m{i}"].isoformat()
        m["text"] = texts.get(m["key"], m["text"])
        survivors.append(m)
    fresh_vecs = vecs[keep].copy()
    for j, m in enumerate(survivors):
        if m["key"] in texts:
            as_message = Message(0, m["key"], m["text"], T0, m["speaker"], "")
            fresh_vecs[j] = emb.encode([embedding_text(as_message, mem.config.embed_template)])[0]
    fresh = TemporalMemory(url, name="fresh", embedder=NoEmbedder())
    fresh.add(survivors, vectors=fresh_vecs)

    want = [(m.key, m.timestamp, m.text) for m in fresh.messages()]
    for m in (mem, other):
        assert len(m) == len(fresh) == len(keep)
        assert [(x.key, x.timestamp, x.text) for x in m.messages()] == want
        a, b = m.timeline(), fresh.timeline()
        assert a.starts == b.starts and np.allclose(a.vectors, b.vectors, atol=1e-6)
        got, expected = _answers(m), _answers(fresh)
        assert [ids for ids, _ in got] == [ids for ids, _ in expected]
        for (_, s1), (_, s2) in zip(got, expected):
            assert np.allclose(s1, s2, rtol=1e-5, atol=1e-6)
    check_tables(url, "managed")
    mem.close(), other.close(), fresh.close()


def test_deletes_and_updates_with_the_hnsw_index(postgres):
    """With the memory's HNSW index built, deleted rows leave the walk's answers (pgvector
    skips dead tuples) and moved ones come back at their new positions."""
    msgs, vecs = records(400)
    url, config = postgres.database(), RetrievalConfig(hnsw_min_messages=0)
    mem = TemporalMemory(url, name="graph", config=config, embedder=NoEmbedder())
    mem.add(msgs, vectors=vecs)
    assert not mem.search("budget", query_vector=vecs[5], exact=False, k=5).exact
    gone = set(mem.delete([f"m{i}" for i in range(0, 400, 3)]))
    moved = mem.update("m5", timestamp=T0 - timedelta(days=1))
    assert moved.id == 0 and len(gone) == 134
    for i in (5, 7, 11):
        hits = mem.search("budget", query_vector=vecs[i], exact=False, k=20, semantic="dense")
        assert not hits.exact and hits.keys[0] == f"m{i}" and not gone & set(hits.keys)
        assert [m.id for m in hits.messages] == hits.positions
    check_tables(url, "graph")
    mem.close()


def test_deletes_adds_and_searches_at_once(postgres):
    """One thread adds out-of-order batches, one deletes (keys, time ranges), one searches,
    each through its own memory object: the row lock serializes the writes, every search
    reads one consistent snapshot, and what is left is what a fresh memory given the
    survivors in their insertion order holds (tables, timeline, answers)."""
    import random

    import psycopg

    msgs, vecs = records(1500, seed=9)
    url = postgres.database()
    opened = [TemporalMemory(url, name="busy", embedder=NoEmbedder()) for _ in range(3)]
    opened[0].add(msgs[:300], vectors=vecs[:300])
    errors, done = [], threading.Event()

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - reported by the main thread
                errors.append(err)

        return run

    def adding():
        order = np.random.default_rng(1).permutation(np.arange(300, 1500))
        for batch in np.array_split(order, 15):
            opened[0].add([msgs[i] for i in batch], vectors=vecs[batch])
        done.set()

    def deleting():
        rng = random.Random(2)
        while not done.is_set():
            opened[1].delete([f"m{rng.randrange(1500)}" for _ in range(5)])
            day = T0 + timedelta(days=rng.randrange(300))
            opened[1].delete_all(day, day + timedelta(hours=12))

    def searching():
        while not done.is_set():
            for text, asked, vec, win in queries(4, seed=5):
                hits = opened[2].search(text, asked_at=asked, windows=win, query_vector=vec, k=10)
                assert [m.id for m in hits.messages] == hits.positions
                assert all(m.timestamp <= asked for m in hits.messages)

    threads = [threading.Thread(target=guarded(f)) for f in (adding, deleting, searching)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    check_tables(url, "busy")
    with psycopg.connect(url) as conn:
        by_seq = [int(k[1:]) for (k,) in conn.execute("SELECT key FROM tider_messages ORDER BY seq")]
    assert 300 < len(by_seq) < 1500
    fresh = TemporalMemory(url, name="fresh", embedder=NoEmbedder())
    fresh.add([msgs[i] for i in by_seq], vectors=vecs[by_seq])
    for m in opened:
        assert [x.key for x in m.messages()] == [x.key for x in fresh.messages()]
        assert m.timeline().starts == fresh.timeline().starts
    got, want = answers(opened[2], True), answers(fresh, True)
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for (_, a), (_, b) in zip(got, want))
    for m in (*opened, fresh):
        m.close()


def test_one_change_re_merges_the_timeline_only_until_it_realigns(postgres):
    """A delete leaves gaps and moves no later position; an update in place moves none.
    Either way the timeline re-merge stops where it opens a cluster an old one opened past
    the change (the later clusters kept), and the result is the timeline a memory built
    from the survivors has."""
    msgs, vecs = records(600)
    url = postgres.database()
    mem = TemporalMemory(url, name="realign", embedder=NoEmbedder())
    mem.add(msgs, vectors=vecs)
    before = mem.timeline().starts
    gone = [mem.messages()[300].key, mem.messages()[301].key, mem.messages()[5].key]
    mem.delete(gone[:2])
    mem.delete(gone[2:])
    assert mem.update(mem.messages()[450].key, metadata={"moved": False}).id == 450
    keep = [i for i, m in enumerate(msgs) if m["key"] not in set(gone)]
    fresh = TemporalMemory(url, name="realign-fresh", embedder=NoEmbedder())
    fresh.add([msgs[i] for i in keep], vectors=vecs[keep])
    assert mem.timeline().starts == fresh.timeline().starts and len(before) > 20
    check_tables(url, "realign")
    mem.close(), fresh.close()


def test_gaps_a_delete_leaves_and_their_compaction(postgres):
    """Deletes leave gaps (the newest too: an in-order add appends past it) and move no
    later row; once the gaps outnumber the messages a delete closes them all. At each step
    search, get, messages and timeline equal those of a fresh memory of the survivors."""
    import psycopg

    msgs, vecs = records(400)
    by_time = sorted(range(400), key=lambda i: msgs[i]["timestamp"])
    url, emb = postgres.database(), HashVectors()
    mem = TemporalMemory(url, name="gappy", embedder=emb)
    mem.add([msgs[i] for i in by_time[:300]], vectors=vecs[by_time[:300]])
    kept = by_time[:300]

    def same_as_fresh(step: str) -> None:
        fresh = TemporalMemory(url, name=f"fresh-{step}", embedder=NoEmbedder())
        fresh.add([msgs[i] for i in kept], vectors=vecs[kept])
        assert [m.key for m in mem.messages()] == [m.key for m in fresh.messages()], step
        assert mem.timeline().starts == fresh.timeline().starts, step
        assert [ids for ids, _ in _answers(mem)] == [ids for ids, _ in _answers(fresh)], step
        probe = mem.messages()[len(kept) // 2].key
        assert mem.get(probe).id == fresh.get(probe).id == fresh.messages().id_of(probe), step
        check_tables(url, "gappy")
        fresh.close()

    def gaps() -> int:
        with psycopg.connect(url) as conn:
            return conn.execute("SELECT gaps FROM tider_memories WHERE name = 'gappy'").fetchone()[0]

    oldest, newest = [msgs[i]["key"] for i in kept[:5]], msgs[kept[-1]]["key"]
    mem.delete(oldest + [newest])
    kept = kept[5:-1]
    assert gaps() == 6
    same_as_fresh("deleted")
    mem.add([msgs[i] for i in by_time[300:350]], vectors=vecs[by_time[300:350]])  # in order, past the gap
    kept = kept + by_time[300:350]
    assert gaps() == 6
    same_as_fresh("appended")
    half = [m.key for m in mem.messages()][::2]  # 172 more gaps than the 6: more than the 172 left
    mem.delete(half)
    kept = [i for i in kept if msgs[i]["key"] not in set(half)]
    assert gaps() == 0  # the gaps outnumbered the messages: closed
    same_as_fresh("compacted")
    few = [mem.messages()[1].key, mem.messages()[3].key]
    mem.delete(few)
    kept = [i for i in kept if msgs[i]["key"] not in set(few)]
    assert gaps() == 2
    same_as_fresh("again")
    mem.close()
