"""The lexical analysis (stems, stop words, language), what a store records of how it was
built, the refusal to open it otherwise, and `tider memory reindex` on both backends."""

from __future__ import annotations

import json
from datetime import timedelta

import numpy as np
import pytest
from test_memory import DIM, T0, NoEmbedder

from tider.memory import StoreError, TemporalMemory
from tider.memory.backends import open_backend
from tider.memory.reindex import reindex
from tider.retrieval.bm25 import BM25Index, tokenize
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.lexical import PLAIN_WORDS, LexicalAnalysis

PLAIN = RetrievalConfig(lexical_stemmer="none")
TEXTS = [
    "The launches slipped to June after the review",
    "Lunch on Friday is pizza",
    "We are planning the offsite budget",
    "Hiring: two engineers joined the design team",
]


def test_terms_are_stemmed_without_stop_words():
    a = LexicalAnalysis()
    assert a.terms("The launches, decided: launching in May") == ["launch", "decid", "launch", "may"]
    assert PLAIN_WORDS.terms("The launches decided") == ["launches", "decided"] == tokenize("The launches decided")
    assert a.id != PLAIN_WORDS.id != LexicalAnalysis("german").id
    assert LexicalAnalysis("german").terms("Die Häuser und das Haus") == ["haus", "haus"]
    with pytest.raises(ValueError, match="lexical language 'klingon' has no stop list"):
        RetrievalConfig(lexical_language="klingon")
    with pytest.raises(ValueError, match="lexical stemmer 'porter' unknown"):
        LexicalAnalysis(stemmer="porter")


@pytest.mark.parametrize("backend", ["bm25s", "rank_bm25"])
def test_an_inflected_query_finds_the_message_only_with_stems(tmp_path, backend):
    stemmed = BM25Index.from_texts(TEXTS, backend=backend)
    plain = BM25Index.from_texts(TEXTS, backend=backend, analysis=PLAIN_WORDS)
    assert sorted(stemmed.search("when was the launch planned?", 2)[0].tolist()) == [0, 2]
    assert plain.scores("when was the launch planned?")[[0, 2]].tolist() == [0.0, 0.0]
    stemmed.save(tmp_path / "i")
    loaded = BM25Index.load(tmp_path / "i")
    assert loaded.analysis == LexicalAnalysis()
    assert np.array_equal(loaded.scores("launched"), stemmed.scores("launched")) and loaded.scores("launched")[0] > 0
    meta = json.loads((tmp_path / "i" / "bm25_meta.json").read_text())
    del meta["analysis"]  # what a tider before recorded analyses saved: plain words
    (tmp_path / "i" / "bm25_meta.json").write_text(json.dumps(meta))
    assert BM25Index.load(tmp_path / "i").analysis == PLAIN_WORDS


def _messages(n: int = 60) -> tuple[list[dict], np.ndarray]:
    rng = np.random.default_rng(3)
    msgs = [
        {
            "key": f"m{i}",
            "text": TEXTS[i % len(TEXTS)] + f" item{i}",
            "timestamp": (T0 + timedelta(hours=i)).isoformat(),
        }
        for i in range(n)
    ]
    vecs = rng.normal(size=(n, DIM)).astype(np.float32)
    return msgs, vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


class FakeEmbedder:
    """A deterministic embedder with a model id (not MiniLM): vectors from the text's hash."""

    model_id = "fake/hash-embedder"

    def encode(self, texts):
        out = np.stack([np.random.default_rng(abs(hash(t)) % 2**32).normal(size=DIM) for t in texts])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(params=["directory", "postgresql"])
def store(request, tmp_path):
    """Where the memories live: a directory of stores, or a real PostgreSQL database."""
    if request.param == "directory":
        return str(tmp_path / "stores")
    return request.getfixturevalue("postgres").database()


def _make_old_store(store: str, msgs, vecs) -> None:
    """A memory as a tider before recorded analyses built it: plain words, no lexical keys."""
    backend = open_backend(store)
    with backend.open("chat", config=PLAIN, embedder=NoEmbedder()) as mem:
        mem.add(msgs, vectors=vecs)
    if "://" in store:
        import psycopg

        with psycopg.connect(store, autocommit=True) as conn:
            conn.execute(
                "UPDATE tider_memories SET config = config - 'lexical_language' - 'lexical_stemmer' WHERE name = 'chat'"
            )
    else:
        path = backend.root / "chat" / "tider_memory.json"
        manifest = json.loads(path.read_text())
        for key in ("lexical_language", "lexical_stemmer"):
            del manifest["config"][key]
        path.write_text(json.dumps(manifest))
    backend.close()


def test_an_old_store_is_refused_then_reindexed_keeping_every_message(store):
    msgs, vecs = _messages()
    _make_old_store(store, msgs, vecs)
    backend = open_backend(store)
    try:
        with backend.open("chat", embedder=NoEmbedder()) as mem:  # its own settings: opens, plain words
            assert mem.config.lexical() == PLAIN_WORDS
            before = mem.search("launch", k=60, semantic="bm25")
        assert before.scores[0] == 0.0  # no message says "launch": plain words find nothing
        with pytest.raises(StoreError, match=r"lexical_stemmer='none', opened with 'snowball'.*tider memory reindex"):
            backend.open("chat", config=RetrievalConfig(), embedder=NoEmbedder())
        done = reindex(backend, "chat", embedder=NoEmbedder())  # vectors kept: nothing embedded
        assert done == {"memory": "chat", "messages": 60, "re_embedded": False}
        assert backend.names() == ["chat"]
        with backend.open("chat", config=RetrievalConfig(), embedder=NoEmbedder()) as mem:
            assert [m.key for m in mem.messages()] == [m["key"] for m in msgs]
            assert np.allclose(mem.vectors_by_position(), vecs, atol=1e-6)
            hits = mem.search("launch", k=15, semantic="bm25")
            assert {h.text for h in hits.messages} == {m["text"] for m in msgs[::4]}  # the 15 "launches"
            assert hits.scores[-1] > 0
    finally:
        backend.close()


def test_another_embedder_is_refused_and_reindex_re_embeds(store):
    msgs, vecs = _messages(30)
    backend = open_backend(store)
    try:
        with backend.open("chat", embedder=NoEmbedder()) as mem:
            mem.add(msgs, vectors=vecs)
        fake = RetrievalConfig(embedding_model=FakeEmbedder.model_id, embed_template="{text}")
        with pytest.raises(StoreError, match=r"embedding_model=None, opened with 'fake/hash-embedder'.*reindex"):
            backend.open("chat", config=fake, embedder=FakeEmbedder())
        with pytest.raises(StoreError, match=r"sentence-transformers/all-MiniLM-L6-v2', opened with 'fake/hash"):
            backend.open("chat", embedder=FakeEmbedder())  # its own config, another embedder
        done = reindex(backend, "chat", fake, embedder=FakeEmbedder())
        assert done["re_embedded"] and done["messages"] == 30
        with backend.open("chat", config=fake, embedder=FakeEmbedder()) as mem:
            assert len(mem) == 30 and not np.allclose(mem.vectors_by_position(), vecs)
            hits = mem.search(msgs[5]["text"], k=3, semantic="dense")
            assert hits.keys[0] == "m5"  # the query embeds as the message did
    finally:
        backend.close()


def test_reindex_command(tmp_path, capsys):
    from tider.cli import main

    msgs, vecs = _messages(20)
    _make_old_store(str(tmp_path / "stores"), msgs, vecs)
    # the old store was built from given vectors: the command reuses them (no embedder needed)
    assert main(["memory", "reindex", "--store", str(tmp_path / "stores")]) == 0
    assert "reindexed chat: 20 messages (vectors kept), lexical words2-stop-english-snowball-english" in (
        capsys.readouterr().out
    )
    with TemporalMemory(tmp_path / "stores" / "chat", config=RetrievalConfig(), embedder=NoEmbedder()) as mem:
        assert len(mem) == 20 and mem.name == "chat"
    with pytest.raises(SystemExit, match="no memory 'nope'"):
        main(["memory", "reindex", "--store", str(tmp_path / "stores"), "--memory", "nope"])


def test_reindex_keeps_the_name_a_store_was_given(tmp_path):
    msgs, vecs = _messages(10)
    with TemporalMemory(tmp_path / "stores" / "team", name="team-chat", config=PLAIN, embedder=NoEmbedder()) as mem:
        mem.add(msgs, vectors=vecs)
    backend = open_backend(str(tmp_path / "stores"))
    assert reindex(backend, "team", embedder=NoEmbedder())["messages"] == 10
    with TemporalMemory(tmp_path / "stores" / "team", config=RetrievalConfig(), embedder=NoEmbedder()) as mem:
        assert mem.name == "team-chat" and len(mem) == 10
    assert sorted(p.name for p in (tmp_path / "stores").iterdir()) == ["team"]  # nothing set aside is left
