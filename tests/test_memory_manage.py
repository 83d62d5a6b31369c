"""Record management on the embedded store (issue 36): get, get_all, update, delete,
delete_all. A managed memory answers as a memory built from its surviving messages would,
through every index, in RAM and on disk, and a deleted text leaves the store's files.
(PostgreSQL: tests/test_memory_postgres.py; HTTP: tests/test_memory_service.py.)"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta

import numpy as np
import pytest
from test_memory import CONFIGS, T0, NoEmbedder, answers, records

from tider.memory import MemoryInputError, TemporalMemory
from tider.memory.records import MessageNotFound
from tider.retrieval.config import RetrievalConfig


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    from tider.retrieval.embed import Embedder

    return Embedder(cache_dir=tmp_path_factory.mktemp("embeddings"))


def store_bytes(root) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_update_then_delete_through_every_index(embedder, tmp_path):
    msgs, _ = records(40)
    msgs[7]["text"] = "we booked the zeppelin tour for the offsite"
    config = RetrievalConfig(semantic="bm25")
    mem = TemporalMemory(tmp_path / "chat", config=config, embedder=embedder)
    mem.add(msgs)
    assert mem.get("m7").text == msgs[7]["text"] and mem.get("nope") is None
    assert mem.search("zeppelin", k=1).keys == ["m7"]

    stored = mem.update("m7", text="we booked the kayak tour for the offsite")
    assert stored.key == "m7" and stored.text.startswith("we booked the kayak") and len(mem) == 40
    assert mem.search("kayak", k=1).keys == ["m7"]
    assert all("zeppelin" not in m.text for m in mem.search("zeppelin", k=40).messages)
    assert mem.search("kayak", k=1, semantic="hybrid").keys == ["m7"]  # the vector was re-embedded too

    assert mem.delete(["m7", "not-there"]) == ["m7"] and len(mem) == 39
    assert mem.get("m7") is None and "m7" not in mem.search("kayak", k=39).keys
    mem.close()
    assert b"kayak" not in store_bytes(tmp_path / "chat") and b"zeppelin" not in store_bytes(tmp_path / "chat")
    with TemporalMemory(tmp_path / "chat", embedder=embedder) as again:
        assert len(again) == 39 and again.get("m7") is None and "m7" not in again.search("kayak", k=39).keys


@pytest.mark.parametrize("kind", sorted(CONFIGS))
@pytest.mark.parametrize("on_disk", [False, True])
def test_a_managed_memory_answers_as_one_built_from_its_survivors(kind, on_disk, tmp_path):
    msgs, vecs = records(700)
    config = CONFIGS[kind]
    mem = TemporalMemory(tmp_path / "managed" if on_disk else None, config=config, embedder=NoEmbedder())
    mem.add(msgs, vectors=vecs)
    answers(mem, exact=kind == "exact")  # the indexes exist before they change
    mem.timeline()
    dropped = {f"m{i}" for i in range(0, 700, 7)}
    assert sorted(mem.delete(sorted(dropped))) == sorted(dropped)
    moved = {"m3": T0 - timedelta(days=5), "m500": T0 + timedelta(days=150)}  # older than all; mid-memory
    for key, when in moved.items():
        assert mem.update(key, timestamp=when).timestamp == when  # the same text: no embedding
    lo, hi = T0 + timedelta(days=200), T0 + timedelta(days=210)
    in_range = [m.key for m in mem.get_all(lo, hi, limit=10_000)]
    assert mem.delete_all(lo, hi) == in_range and in_range

    gone = dropped | set(in_range)
    keep = [i for i in range(700) if f"m{i}" not in gone]
    survivors = [{**msgs[i], **({"timestamp": moved[f"m{i}"].isoformat()} if f"m{i}" in moved else {})} for i in keep]
    fresh = TemporalMemory(None, config=config, embedder=NoEmbedder())
    fresh.add(survivors, vectors=vecs[keep])
    for m in [mem] + ([None] if on_disk else []):
        if m is None:  # the same memory read back from its files
            mem.close()
            m = TemporalMemory(tmp_path / "managed", embedder=NoEmbedder())
        assert [x.key for x in m.messages()] == [x.key for x in fresh.messages()]
        assert m.timeline().starts == fresh.timeline().starts
        assert answers(m, exact=kind == "exact") == answers(fresh, exact=kind == "exact")


def _lines(root) -> list[dict]:
    manifest = json.loads((root / "tider_memory.json").read_text())
    names = [s["name"] for s in manifest["segments"]]
    return manifest, [json.loads(x) for n in names for x in (root / "segments" / f"{n}.jsonl").read_text().splitlines()]


def test_changes_mark_rows_dead_and_a_quarter_dead_compacts(tmp_path):
    """A delete or an update moves no row (tider.memory.tombstones): the dead rows' lines
    are scrubbed, the faiss rows stay, an update whose time keeps its place keeps its
    position. Past a quarter dead the store is rewritten as its survivors. At each step it
    answers as a memory built from the survivors, in RAM and read back."""
    msgs, vecs = records(200)
    config, root = CONFIGS["index"], tmp_path / "m"
    mem = TemporalMemory(root, config=config, embedder=NoEmbedder())
    for part in np.array_split(np.arange(200), 4):
        mem.add([msgs[i] for i in part], vectors=vecs[part])
    answers(mem, exact=False)
    mem.timeline()
    faiss, position = mem.state.faiss(), mem.get("m50").id
    assert mem.update("m50", metadata={"topic": "offsite"}).id == position  # same text and time: same place
    assert sorted(mem.delete(["m10", "m120"])) == ["m10", "m120"]
    manifest, lines = _lines(root)
    assert len(manifest["dead"]) == 3 and len(lines) == 201 and mem.state.n_rows == 201 and len(mem) == 198
    assert sum(line == {"dead": True} for line in lines) == 3 and lines[-1]["seq"] == manifest["dead"][1]
    assert mem.state.faiss() is faiss

    def fresh_from(gone: set[str]):
        keep = [i for i in range(200) if f"m{i}" not in gone]
        fresh = TemporalMemory(None, config=config, embedder=NoEmbedder())
        fresh.add([{**msgs[i], **({"metadata": {"topic": "offsite"}} if i == 50 else {})} for i in keep], vecs[keep])
        return fresh

    fresh = fresh_from({"m10", "m120"})
    assert [m.key for m in mem.messages()] == [m.key for m in fresh.messages()]
    assert mem.timeline().starts == fresh.timeline().starts
    assert answers(mem, exact=False) == answers(fresh, exact=False)

    gone = {"m10", "m120"} | {f"m{i}" for i in range(130, 180)}
    mem.delete(sorted(gone))  # 53 of 201 rows dead: compacted
    manifest, lines = _lines(root)
    assert manifest["dead"] == [] and len(manifest["segments"]) == 1 and len(lines) == len(mem) == 148
    assert not any("seq" in line or line == {"dead": True} for line in lines)
    fresh = fresh_from(gone)
    for m in (mem, None):
        if m is None:
            mem.close()
            m = TemporalMemory(root, embedder=NoEmbedder())
        assert [x.key for x in m.messages()] == [x.key for x in fresh.messages()]
        assert answers(m, exact=False) == answers(fresh, exact=False)
        assert dict(m.get("m50").metadata) == {"topic": "offsite"}


def test_a_change_cut_before_its_scrub_is_finished_at_the_next_open(embedder, tmp_path, monkeypatch):
    """The manifest is the commit point: a delete killed after it (before the text left the
    segment file) is a delete, and the next open scrubs the line."""
    from tider.memory.tombstones import Tombstones

    msgs, _ = records(30)
    msgs[4]["text"] = "the zeppelin tour is booked"
    mem = TemporalMemory(tmp_path / "m", embedder=embedder)
    mem.add(msgs)
    real = Tombstones._scrub
    monkeypatch.setattr(Tombstones, "_scrub", lambda self, rows: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        mem.delete(["m4"])
    mem.state.files.close()  # the process died: nothing more is written
    assert b"zeppelin" in store_bytes(tmp_path / "m")
    monkeypatch.setattr(Tombstones, "_scrub", real)
    with TemporalMemory(tmp_path / "m", embedder=embedder) as again:
        assert again.get("m4") is None and len(again) == 29
        assert b"zeppelin" not in store_bytes(tmp_path / "m")
        assert "m4" not in again.search("zeppelin tour", k=29).keys


def test_get_all_pages_and_bad_calls_change_nothing(tmp_path):
    msgs, vecs = records(50)
    mem = TemporalMemory(tmp_path / "m", embedder=NoEmbedder())
    mem.add(msgs, vectors=vecs)
    everything = mem.get_all(limit=50)
    assert [m.id for m in everything] == list(range(50))
    pages = [mem.get_all(offset=o, limit=7) for o in range(0, 50, 7)]
    assert [m.key for page in pages for m in page] == [m.key for m in everything]
    lo, hi = everything[10].timestamp, everything[20].timestamp
    assert all(lo <= m.timestamp <= hi for m in mem.get_all(lo, hi)) and len(mem.get_all(lo, hi)) >= 11
    for call, field in [
        (lambda: mem.get_all(limit=0), "limit"),
        (lambda: mem.get_all(offset=-1), "offset"),
        (lambda: mem.get_all(hi, lo), "end"),
        (lambda: mem.get_all("yesterday"), "start"),
        (lambda: mem.update("m1"), "update"),
        (lambda: mem.update("m1", timestamp="soon"), "timestamp"),
        (lambda: mem.update("m1", text=5), "update.text"),
        (lambda: mem.delete([3]), "keys"),
    ]:
        with pytest.raises(MemoryInputError) as err:
            call()
        assert err.value.field == field, err.value
    with pytest.raises(MessageNotFound, match="'nope'"):
        mem.update("nope", text="x")
    assert mem.delete([]) == [] and mem.delete("nope") == []
    assert [m.key for m in mem.get_all(limit=50)] == [m.key for m in everything]
    assert mem.delete_all() == [m.key for m in everything] and len(mem) == 0
    mem.add(msgs[:3], vectors=vecs[:3])  # an emptied memory takes adds again
    assert len(mem) == 3 and np.isfinite(mem.search(msgs[0]["text"], query_vector=vecs[0]).scores).all()


@pytest.mark.parametrize("backend", ["directory", "postgres"])
def test_an_update_never_loses_a_change_made_between_its_read_and_its_write(backend, embedder, tmp_path, request):
    """A text update racing a time update: each re-reads a message changed under it, so both
    changes land (and the text's vector is the text's); a conditional one gets the conflict."""
    from tider.memory.records import VersionConflict, version_of

    where = tmp_path / "race" if backend == "directory" else request.getfixturevalue("postgres").database()
    mem = TemporalMemory(where, name="race", embedder=embedder, config=RetrievalConfig(semantic="dense"))
    mem.add([{"key": "a", "text": "the launch is on monday", "timestamp": "2024-01-01T10:00:00"}])
    read = mem.get("a")
    real_replace = mem._replace
    calls = []

    def replace_after_a_rival(old, new):
        if not calls:  # a rival's time update lands between this update's read and its write
            calls.append(1)
            real_replace(old, dataclasses.replace(old, timestamp=datetime(2024, 2, 2, 9)))
        return real_replace(old, new)

    mem._replace = replace_after_a_rival
    stored = mem.update("a", text="the launch moved to friday")
    mem._replace = real_replace
    assert stored.text == "the launch moved to friday" and stored.timestamp.isoformat() == "2024-02-02T09:00:00"
    assert mem.search("launch friday", k=1).keys == ["a"]
    with pytest.raises(VersionConflict) as err:
        mem.update("a", text="stale", if_version=version_of(read))
    assert err.value.current == version_of(mem.get("a")) and mem.get("a").text == "the launch moved to friday"


@pytest.mark.parametrize("backend", ["directory", "postgres"])
def test_deleted_and_rewritten_texts_leave_the_vector_cache(backend, tmp_path, request):
    """The embedder's disk cache holds a vector per text; a deleted message's, and a rewritten
    message's old text's, are removed with it (README: what is written where)."""
    from tider.retrieval.embed import Embedder, embedding_text, text_hash

    embedder = Embedder(cache_dir=tmp_path / "cache")
    where = tmp_path / "m" if backend == "directory" else request.getfixturevalue("postgres").database()
    mem = TemporalMemory(where, name="forget", embedder=embedder)
    msgs = [
        {"key": "a", "text": "the secret plan is to move to Oslo", "timestamp": "2024-01-01T10:00:00"},
        {"key": "b", "text": "lunch was fine", "timestamp": "2024-01-02T10:00:00"},
        {"key": "c", "text": "the budget is 20k", "timestamp": "2024-01-03T10:00:00"},
    ]
    mem.add(msgs)

    def cached(key: str) -> bool:
        return embedder._path(text_hash(embedding_text(mem.get(key), mem.config.embed_template))).exists()

    assert cached("a") and cached("b") and cached("c")
    old_b = embedder._path(text_hash(embedding_text(mem.get("b"), mem.config.embed_template)))
    old_a = embedder._path(text_hash(embedding_text(mem.get("a"), mem.config.embed_template)))
    mem.update("b", text="lunch was great")
    assert not old_b.exists() and cached("b")
    mem.delete(["a"])
    assert not old_a.exists()
    old_c = embedder._path(text_hash(embedding_text(mem.get("c"), mem.config.embed_template)))
    assert mem.delete_all(start="2024-01-03") == ["c"] and not old_c.exists()
    mem.close()


@pytest.mark.parametrize("backend", ["directory", "postgres"])
def test_metadata_is_stored_returned_and_updated(backend, embedder, tmp_path, request):
    where = tmp_path / "meta" if backend == "directory" else request.getfixturevalue("postgres").database()
    mem = TemporalMemory(where, name="meta", embedder=embedder)
    mem.add(
        [
            {
                "key": "a",
                "text": "refund approved",
                "timestamp": "2024-01-01T10:00:00",
                "metadata": {"ticket": 7, "vip": True},
            },
            {"key": "b", "text": "no metadata here", "timestamp": "2024-01-02T10:00:00"},
        ]
    )
    assert dict(mem.get("a").metadata) == {"ticket": 7, "vip": True} and mem.get("b").metadata == ()
    changed = mem.update("a", metadata={"ticket": 8, "team": "billing"})
    assert dict(changed.metadata) == {"ticket": 8, "team": "billing"} and changed.text == "refund approved"
    with pytest.raises(MemoryInputError, match="metadata"):
        mem.add([{"key": "c", "text": "x", "timestamp": "2024-01-03", "metadata": {"bad": [1, 2]}}])
    mem.close()
    again = TemporalMemory(where, name="meta", embedder=embedder)
    assert dict(again.get("a").metadata) == {"ticket": 8, "team": "billing"}
    again.close()


def test_a_text_with_a_unicode_line_separator_opens_again(tmp_path):
    """JSON leaves U+2028 and U+2029 unescaped (``ensure_ascii=False``); the segment reader
    once split lines at them as well, and the store holding one no longer opened."""
    msgs, vecs = records(4)
    msgs[1]["text"] = "line one\u2028line two\u2029line three"
    with TemporalMemory(tmp_path / "m", embedder=NoEmbedder()) as mem:
        mem.add(msgs, vectors=vecs)
        mem.delete(["m2"])  # the scrub rewrites the same file
    with TemporalMemory(tmp_path / "m", embedder=NoEmbedder()) as mem:
        assert len(mem) == 3 and mem.get("m1").text == msgs[1]["text"]


def test_an_open_keeps_the_indexes_saved_after_a_delete(tmp_path):
    """The scrub at an open is crash recovery only: a store closed after a delete reopens
    with the derived indexes it saved (no timeline or postings rebuilt for nothing)."""
    msgs, vecs = records(60)
    with TemporalMemory(tmp_path / "m", embedder=NoEmbedder()) as mem:
        mem.add(msgs, vectors=vecs)
        mem.search("offsite budget", query_vector=vecs[0], k=5)
        mem.timeline()
        mem.delete(["m7"])
        mem.search("offsite budget", query_vector=vecs[0], k=5)
        mem.timeline()
    saved = json.loads((tmp_path / "m" / "index" / "derived.json").read_text())
    assert {"postings", "timeline"} <= set(saved)
    with TemporalMemory(tmp_path / "m", embedder=NoEmbedder()) as mem:
        assert json.loads((tmp_path / "m" / "index" / "derived.json").read_text()) == saved
        assert mem.get("m7") is None and len(mem) == 59
