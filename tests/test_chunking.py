"""Long messages embedded as overlapping chunks of the embedder's window (tider.retrieval.embed):
the pieces, the dense channel finding a message by its tail, both backends ranking alike, and a
store built without chunks refused, then reindexed. The real MiniLM embedder throughout."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta

import numpy as np
import pytest

from tider.memory import StoreError, TemporalMemory
from tider.memory.backends import open_backend
from tider.memory.reindex import reindex
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.embed import CHUNK_OVERLAP, Embedder, chunking_id, message_chunks, piece_starts
from tider.types import Message

WINDOW = RetrievalConfig()
NO_CHUNKS = RetrievalConfig(embed_chunking="none")
FILLER = " ".join(
    f"The quarterly planning meeting covered budget line {i} and the staffing of team {i % 7}." for i in range(40)
)
TAIL = " Finally, Priya mentioned that her grandmother's lighthouse in Tasmania was repainted bright purple."
QUESTION = "What colour was the lighthouse in Tasmania repainted?"


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return Embedder(cache_dir=tmp_path_factory.mktemp("embeddings"))


def _messages(short: int = 30) -> list[dict]:
    """One long message whose only mention of the lighthouse is its last sentence, past the
    first window, among short ones about other things."""
    msgs = [{"key": "long", "text": FILLER + TAIL, "timestamp": "2024-01-01T10:00:00", "speaker": "ana"}]
    t0 = datetime(2024, 1, 2)
    msgs += [
        {
            "key": f"s{i}",
            "text": f"Short note {i} about lunch, the coast and the weather on day {i}.",
            "timestamp": (t0 + timedelta(hours=i)).isoformat(),
            "speaker": "bo",
        }
        for i in range(short)
    ]
    return msgs


def test_pieces_are_whole_windows_overlapping_by_a_quarter():
    assert piece_starts(254, 254) == [] and piece_starts(100, 254) == []
    for n, budget in ((255, 254), (600, 254), (5000, 200), (1001, 10)):
        starts = [0, *piece_starts(n, budget)]
        assert starts[-1] == n - budget  # the last piece ends the text
        gaps = np.diff(starts)
        assert (gaps > 0).all() and (gaps <= budget - int(budget * CHUNK_OVERLAP)).all()


def test_split_cuts_between_words_and_covers_the_text(embedder):
    window = embedder.window
    assert window == embedder.model.max_seq_length - 2  # MiniLM: 256 less [CLS] and [SEP]
    text = FILLER + TAIL
    pieces = embedder.split(text, window)
    counts = embedder.token_counts(pieces)
    assert len(pieces) >= 2 and max(counts) <= window
    assert text.startswith(pieces[0]) and text.endswith(pieces[-1])
    for a, b in itertools.pairwise(pieces):  # neighbours share text: a quarter window, less a cut word
        assert text.index(b) < text.index(a) + len(a) - 100
    assert embedder.split("a short message", window) == ["a short message"]
    short = Message(0, "k", "a short message", datetime(2024, 1, 1), "ana", "s1")
    long = Message(1, "l", text, datetime(2024, 1, 1), "ana", "s1")
    chunks = message_chunks(embedder, [short, long], "{speaker}: {text}")
    assert chunks[0] == []  # a message that fits keeps its one vector: LoCoMo's do
    assert all(c.startswith("ana: ") for c in chunks[1]) and chunks[1][-1].endswith(TAIL.strip())
    assert max(embedder.token_counts(chunks[1])) <= window
    assert chunking_id(embedder, "window") == f"window{window}-overlap{int(window * CHUNK_OVERLAP)}"
    assert chunking_id(embedder, "none") == "none" == chunking_id(object(), "window")


@pytest.mark.parametrize("exact", [True, False])
def test_the_tail_of_a_long_message_is_found_only_with_chunks(embedder, exact):
    msgs = _messages()
    ranks = {}
    for config in (WINDOW, NO_CHUNKS):
        mem = TemporalMemory(None, config=config, embedder=embedder)
        mem.add(msgs)
        hits = mem.search(QUESTION, k=len(msgs), semantic="dense", exact=exact)
        ranks[config.embed_chunking] = hits.keys.index("long")
    assert ranks == {"window": 0, "none": ranks["none"]} and ranks["none"] >= 5


def test_chunks_persist_through_reopening_and_segment_merges(embedder, tmp_path):
    msgs = _messages(34)
    with TemporalMemory(tmp_path / "chat", config=WINDOW, embedder=embedder) as mem:
        mem.add(msgs[:1])
        for m in msgs[1:]:  # 35 adds: past 32 segments they are merged into one
            mem.add([m])
        assert len(mem.state.manifest["segments"]) < 35
        first = mem.search(QUESTION, k=5, semantic="dense")
    manifest = json.loads((tmp_path / "chat" / "tider_memory.json").read_text())
    assert manifest["embedding"]["chunking"] == chunking_id(embedder, "window")
    with TemporalMemory(tmp_path / "chat", config=WINDOW, embedder=embedder) as mem:
        long = mem.messages().messages[:1]
        assert mem.state.chunks.n == len(message_chunks(embedder, long, WINDOW.embed_template)[0]) > 0
        again = mem.search(QUESTION, k=5, semantic="dense")
    assert again.keys == first.keys and again.keys[0] == "long" and np.allclose(again.scores, first.scores)


@pytest.fixture(params=["directory", "postgresql"])
def store(request, tmp_path):
    if request.param == "directory":
        return str(tmp_path / "stores")
    return request.getfixturevalue("postgres").database()


def test_both_backends_rank_long_messages_alike(embedder, tmp_path, request):
    url = request.getfixturevalue("postgres").database()
    msgs = _messages()
    results = {}
    for where in (str(tmp_path / "stores"), url):
        backend = open_backend(where)
        try:
            with backend.open("chat", config=WINDOW, embedder=embedder) as mem:
                mem.add(msgs)
                results[where] = [
                    mem.search(q, k=10, semantic=mode)
                    for q in (QUESTION, "budget line 12 staffing", "lunch on day 7")
                    for mode in ("dense", "hybrid")
                ]
        finally:
            backend.close()
    embedded, database = results.values()
    assert embedded[0].keys[0] == database[0].keys[0] == "long"
    for a, b in zip(embedded, database):
        assert a.keys == b.keys
        assert np.allclose(a.scores, b.scores, atol=1e-5)


def test_a_store_without_chunks_is_refused_then_reindexed(embedder, store):
    msgs = _messages()
    backend = open_backend(store)
    try:
        with backend.open("chat", config=NO_CHUNKS, embedder=embedder) as mem:
            mem.add(msgs)
            vectors = mem.vectors_by_position()
            assert mem.search(QUESTION, k=5, semantic="dense").keys[0] != "long"
        with pytest.raises(StoreError, match=r"embed_chunking='none', opened with 'window'.*tider memory reindex"):
            backend.open("chat", config=WINDOW, embedder=embedder)
        done = reindex(backend, "chat", embedder=embedder)
        assert done == {"memory": "chat", "messages": len(msgs), "re_embedded": False}
        with backend.open("chat", config=WINDOW, embedder=embedder) as mem:
            assert [m.key for m in mem.messages()] == [m["key"] for m in msgs]
            assert np.allclose(mem.vectors_by_position(), vectors, atol=1e-6)  # each message's own vector kept
            assert mem.search(QUESTION, k=5, semantic="dense").keys[0] == "long"
    finally:
        backend.close()


def test_a_store_from_before_chunking_is_refused(embedder, tmp_path):
    """A manifest that predates the setting records no ``embed_chunking``: built without."""
    with TemporalMemory(tmp_path / "chat", config=WINDOW, embedder=embedder) as mem:
        mem.add(_messages()[:3])
    path = tmp_path / "chat" / "tider_memory.json"
    manifest = json.loads(path.read_text())
    del manifest["config"]["embed_chunking"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=r"embed_chunking='none', opened with 'window'.*reindex --store"):
        TemporalMemory(tmp_path / "chat", config=WINDOW, embedder=embedder)


def test_evidence_selection_scores_a_long_message_by_its_best_chunk(embedder, tmp_path, request):
    """``dense_scores_at`` (what the context builder ranks a window's messages by) agrees with
    the dense channel on both backends: the long message scores by its tail's chunk."""
    url = request.getfixturevalue("postgres").database()
    msgs = _messages()
    scores = []
    for where in (str(tmp_path / "stores"), url):
        backend = open_backend(where)
        try:
            with backend.open("chat", config=WINDOW, embedder=embedder) as mem:
                mem.add(msgs)
                vector = mem.embed_queries([QUESTION])[0]
                at = mem.dense_scores_at(vector, [0, 1, 2])
                hit = mem.search(QUESTION, k=1, semantic="dense")
                own = mem.vectors_by_position()[0] @ vector
                assert hit.positions == [0] and np.isclose(at[0], hit.scores[0], atol=1e-5) and at[0] > own + 0.1
                scores.append(at)
        finally:
            backend.close()
    assert np.allclose(scores[0], scores[1], atol=1e-5)
