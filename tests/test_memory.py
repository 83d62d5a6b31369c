"""TemporalMemory: incremental = one-shot, persistence, crash safety, no memory from the future."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from tider.memory import MemoryInputError, StoreError, TemporalMemory
from tider.retrieval.config import RetrievalConfig
from tider.types import NON_TEMPORAL, Window, WindowPrediction

T0 = datetime(2023, 1, 2, 9, 0)
WORDS = [
    "offsite",
    "budget",
    "launch",
    "design",
    "review",
    "roadmap",
    "lunch",
    "demo",
    "hiring",
    "retro",
    "bug",
    "release",
    "plan",
    "vote",
]
DIM = 16


class NoEmbedder:
    """Fails the test if anything is embedded: stores opened with it must not re-embed."""

    model_name = "none"

    def encode(self, texts):
        raise AssertionError(f"embedder called for {len(texts)} texts")


def records(n: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    rng = np.random.default_rng(seed)
    msgs = []
    for i in range(n):
        day = int(rng.integers(0, 300))
        ts = T0 + timedelta(days=day, minutes=int(rng.integers(0, 3)) * 30)  # many equal timestamps
        text = " ".join(rng.choice(WORDS, size=6))
        msgs.append({"key": f"m{i}", "text": text, "timestamp": ts.isoformat(), "speaker": f"u{i % 3}"})
    vecs = rng.normal(size=(n, DIM)).astype(np.float32)
    return msgs, vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def queries(n: int = 12, seed: int = 1):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        vec = rng.normal(size=DIM).astype(np.float32)
        asked = T0 + timedelta(days=int(rng.integers(50, 320)))
        start = T0 + timedelta(days=int(rng.integers(0, 280)))
        windows = NON_TEMPORAL if i % 3 == 0 else WindowPrediction(True, (Window(start, start + timedelta(days=10)),))
        out.append((" ".join(rng.choice(WORDS, size=3)), asked, vec / np.linalg.norm(vec), windows))
    return out


def answers(mem: TemporalMemory, exact: bool) -> list:
    return [
        (h.keys, h.scores)
        for text, asked, vec, win in queries()
        for h in [mem.search(text, asked_at=asked, windows=win, query_vector=vec, exact=exact, k=10)]
    ]


CONFIGS = {
    "exact": RetrievalConfig(),
    # index-backed from the first message: faiss HNSW over whole 4096-row chunks + a flat tail
    "index": RetrievalConfig(index_min_messages=0, hnsw_min_messages=0, index_depth=50),
}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_incremental_adds_equal_one_add(kind, tmp_path):
    msgs, vecs = records(5000)
    # One sequence: 3000 messages in time order, then the rest newest first (out of order).
    # Equal timestamps keep the order of addition, so only the split may differ.
    by_time = list(np.argsort([m["timestamp"] for m in msgs], kind="stable"))
    seq = np.array(sorted(by_time[:3000]) + sorted(by_time[3000:], key=lambda i: msgs[i]["timestamp"], reverse=True))
    one = TemporalMemory(None, config=CONFIGS[kind], embedder=NoEmbedder())
    one.add([msgs[i] for i in seq], vectors=vecs[seq])
    parts = TemporalMemory(tmp_path / "parts", config=CONFIGS[kind], embedder=NoEmbedder())
    parts.add([msgs[i] for i in seq[:3000]], vectors=vecs[seq[:3000]])
    assert answers(parts, kind == "exact")  # search in between: lazily built indexes must catch up
    for chunk in np.array_split(seq[3000:], 5):
        parts.add([msgs[i] for i in chunk], vectors=vecs[chunk])
    assert parts.add(msgs[:10], vectors=vecs[:10]) == [m["key"] for m in msgs[:10]]  # re-adds: no-ops
    assert len(parts) == len(one) == 5000
    assert [m.key for m in parts.messages()] == [m.key for m in one.messages()]
    assert answers(parts, kind == "exact") == answers(one, kind == "exact")
    a, b = parts.timeline(), one.timeline()
    assert a.starts == b.starts and a.entries == b.entries


def test_index_path_equals_exact_when_the_lists_cover_the_memory():
    msgs, vecs = records(300)
    exact = TemporalMemory(None, embedder=NoEmbedder())
    index = TemporalMemory(None, config=RetrievalConfig(index_min_messages=0, index_depth=1000), embedder=NoEmbedder())
    exact.add(msgs, vectors=vecs)
    index.add(msgs, vectors=vecs)
    got, want = answers(index, exact=False), answers(exact, exact=True)
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    assert [s for _, s in got] == [s for _, s in want]  # same matrix product, same fusion arithmetic: same floats


def test_nothing_after_asked_at(tmp_path):
    msgs, vecs = records(600)
    everything = WindowPrediction(True, (Window(T0, T0 + timedelta(days=400)),))
    for cfg in CONFIGS.values():
        mem = TemporalMemory(None, config=cfg, embedder=NoEmbedder())
        mem.add(msgs, vectors=vecs)
        for text, asked, vec, _ in queries():
            for windows in (NON_TEMPORAL, everything):
                hits = mem.search(text, asked_at=asked, windows=windows, query_vector=vec, k=50)
                assert hits.keys and all(m.timestamp <= asked for m in hits.messages)
        assert mem.search("budget", asked_at=T0 - timedelta(days=1), query_vector=vecs[0]).keys == []
    off = TemporalMemory(None, config=RetrievalConfig(past_only=False), embedder=NoEmbedder())
    off.add(msgs, vectors=vecs)
    hits = off.search("budget", asked_at=T0, query_vector=vecs[0], k=50)
    assert any(m.timestamp > T0 for m in hits.messages)  # the switch does what it says


def test_reopen_answers_identically_without_the_embedder(tmp_path):
    msgs, vecs = records(800)
    cfg = RetrievalConfig(index_min_messages=0, hnsw_min_messages=0)
    with TemporalMemory(tmp_path / "s", config=cfg, embedder=NoEmbedder()) as mem:
        mem.add(msgs[:500], vectors=vecs[:500])
        mem.add(msgs[500:], vectors=vecs[500:])
        before = answers(mem, exact=False), answers(mem, exact=True), len(mem.timeline())
    reopened = TemporalMemory(tmp_path / "s", embedder=NoEmbedder())
    assert reopened.config == cfg and len(reopened) == 800
    assert (answers(reopened, exact=False), answers(reopened, exact=True), len(reopened.timeline())) == before
    reopened.close()
    with pytest.raises(StoreError, match="built with embed_template"):
        TemporalMemory(tmp_path / "s", config=RetrievalConfig(embed_template="{text}"), embedder=NoEmbedder())
    with (
        TemporalMemory(tmp_path / "s", embedder=NoEmbedder()),
        pytest.raises(StoreError, match="open in another process"),
    ):
        TemporalMemory(tmp_path / "s", embedder=NoEmbedder())


def test_a_store_recording_a_removed_timeline_setting_opens(tmp_path):
    """Stores made up to fa11d15 record timeline.summary_words (the length of summaries
    nothing read, gone since): it never changed what a store returns, so any value is dropped."""
    msgs, vecs = records(200)
    cfg = RetrievalConfig()
    with TemporalMemory(tmp_path / "s", config=cfg, embedder=NoEmbedder()) as mem:
        mem.add(msgs, vectors=vecs)
        before = answers(mem, exact=True), mem.timeline().starts
    manifest = tmp_path / "s" / "tider_memory.json"
    data = json.loads(manifest.read_text())
    data["config"]["timeline"]["summary_words"] = 24
    manifest.write_text(json.dumps(data))
    with TemporalMemory(tmp_path / "s", config=cfg, embedder=NoEmbedder()) as reopened:
        assert reopened.config == cfg and (answers(reopened, exact=True), reopened.timeline().starts) == before


def test_bad_input_names_the_field_and_changes_nothing(tmp_path):
    mem = TemporalMemory(tmp_path / "s", embedder=NoEmbedder())
    good = {"text": "hello", "timestamp": "2024-02-01T10:00:00+02:00", "speaker": "ana"}
    cases = [
        ([{"text": "x"}], "messages[0].timestamp"),
        ([{"text": "x", "timestamp": "yesterday-ish"}], "messages[0].timestamp"),
        ([good, {"text": 3, "timestamp": "2024-01-01"}], "messages[1].text"),
        ([{**good, "colour": "red"}], "messages[0].colour"),
        ("not a list", "messages"),
    ]
    for batch, field in cases:
        with pytest.raises(MemoryInputError) as err:
            mem.add(batch, vectors=None if isinstance(batch, str) else np.ones((len(batch), DIM), np.float32))
        assert err.value.field == field
    with pytest.raises(MemoryInputError, match="vectors"):
        mem.add([good], vectors=np.ones((2, DIM), np.float32))
    assert len(mem) == 0
    keys = mem.add(
        [good, {**good, "key": "k2", "timestamp": datetime(2024, 2, 1, 9, 0, tzinfo=timezone.utc)}],
        vectors=np.eye(2, DIM, dtype=np.float32),
    )
    assert keys[0].startswith("m-") and keys[1] == "k2"
    assert [m.timestamp for m in mem.messages()] == [datetime(2024, 2, 1, 8, 0), datetime(2024, 2, 1, 9, 0)]  # UTC
    assert mem.add([good], vectors=np.ones((1, DIM), np.float32)) == keys[:1] and len(mem) == 2  # re-add: no-op


CHILD = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, {tests!r})
    from test_memory import NoEmbedder, records
    from tider.memory import TemporalMemory
    msgs, vecs = records(40 * 250, seed=7)
    mem = TemporalMemory(sys.argv[1], embedder=NoEmbedder())
    for b in range(len(mem) // 250, 40):
        mem.add(msgs[b * 250:(b + 1) * 250], vectors=np.repeat(vecs[b * 250:(b + 1) * 250], 24, axis=1))
        print("added", b, flush=True)
""")


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_kill_9_during_add_keeps_every_returned_add_and_no_half(delay, tmp_path):
    """A real subprocess adds 250-message batches (~0.4 MB of vectors each) and is killed
    with SIGKILL while adding; the store must open with whole batches only, at least all
    that returned."""
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(Path(__file__).parent)))
    store = tmp_path / "store"
    for round_ in range(2):  # kill, then resume in a second process and kill again
        proc = subprocess.Popen(
            [sys.executable, str(script), str(store)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        returned = -1
        for line in proc.stdout:
            returned = int(line.split()[1])
            if returned >= 2 + 3 * round_:
                break
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        mem = TemporalMemory(store, embedder=NoEmbedder())
        n = len(mem)
        assert n % 250 == 0 and n >= 250 * (returned + 1)
        msgs, _ = records(n, seed=7)
        assert sorted(m.key for m in mem.messages()) == sorted(m["key"] for m in msgs[:n])
        mem.close()


def test_memories_of_one_process_share_one_embedder_with_a_bounded_memo(tmp_path, monkeypatch):
    """Issue 44 item 3: every memory opened without an embedder uses the process's one
    Embedder (one model in memory, not one per memory), and its vector memo is bounded."""
    from tider.retrieval import embed

    a, b = TemporalMemory(tmp_path / "a"), TemporalMemory(tmp_path / "b")
    assert a.state.embedder is b.state.embedder is embed.shared_embedder()
    a = a.state
    monkeypatch.setattr(embed, "MEMO_SIZE", 3)
    vectors = a.embedder.encode([f"note {i}" for i in range(5)])
    assert len(a.embedder._memory) == 3 and list(a.embedder._memory) == [
        embed.text_hash(f"note {i}") for i in (2, 3, 4)
    ]
    assert np.allclose(a.embedder.encode(["note 0"])[0], vectors[0])  # read back from the disk cache


def test_a_question_asked_of_a_memory_leaves_no_vector_on_disk(tmp_path, monkeypatch):
    """Issue 44 item 5: the embedder's disk cache holds messages' vectors, never the
    questions asked of an application's memory (unless TIDER_CUE_CACHE opts in)."""
    from tider.retrieval.embed import text_hash

    monkeypatch.delenv("TIDER_CUE_CACHE", raising=False)
    config = RetrievalConfig(embedding_cache_dir=str(tmp_path / "vectors"))
    memory = TemporalMemory(tmp_path / "m", config=config)
    memory.add([{"key": "a", "text": "The offsite is in Lisbon", "timestamp": "2024-02-01T10:00:00"}])
    question = "where is the offsite held this spring?"
    assert memory.search(question, k=1).messages
    on_disk = {p.stem for p in (tmp_path / "vectors").rglob("*.npy")}
    assert on_disk  # the message's vector is cached (its embedding text, speaker included)
    assert text_hash(question) not in on_disk
    monkeypatch.setenv("TIDER_CUE_CACHE", str(tmp_path / "cues.jsonl"))  # the opt-in keeps questions
    other = "who booked the offsite venue?"
    memory.search(other, k=1)
    assert text_hash(other) in {p.stem for p in (tmp_path / "vectors").rglob("*.npy")}
