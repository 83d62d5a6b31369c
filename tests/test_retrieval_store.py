"""MemoryCollection (the harness's memories), Embedder cache and window sources with the real MiniLM model."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from tider.locator.sources import gold_predictions, make_source
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.embed import Embedder
from tider.scoring import evidence_coverage
from tider.types import Gold, Memory, Message, Query, Window

LOCOMO = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "locomo" / "locomo_dev.json"
T0 = datetime(2023, 1, 2, 10, 0)
TEXTS = [
    "I adopted a puppy named Max",
    "We went hiking in the Alps",
    "My sister got married in June",
    "I started learning the violin",
    "Max chewed my new shoes",
    "The Alps trip was freezing",
    "Violin lessons are hard but fun",
    "The wedding cake was chocolate",
    "Max learned to sit",
    "Planning another hike next spring",
]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return Embedder(cache_dir=tmp_path_factory.mktemp("emb"))


@pytest.fixture(scope="module")
def toy(embedder):
    msgs = [
        Message(
            id=i,
            key=f"D{i}",
            text=t,
            timestamp=T0 + timedelta(days=20 * i),
            speaker="Ann" if i % 2 else "Bo",
            session=f"s{i}",
        )
        for i, t in enumerate(TEXTS)
    ]
    mem = Memory("toy", msgs)
    q = Query(
        "toy:q0",
        "toy",
        "What did Max chew?",
        T0 + timedelta(days=300),
        user="Bo",
        gold=Gold(
            evidence_ids=(4, 8), windows=(Window(T0 + timedelta(days=80), T0 + timedelta(days=80)),), temporal=True
        ),
    )
    from tider.memory import MemoryCollection

    return MemoryCollection({"toy": mem}, RetrievalConfig(k=3), embedder=embedder), q


def _coverage(store, q, pred, k):
    return evidence_coverage(store.retrieve(q.public(), pred, k)[0].tolist(), q.gold.evidence_ids, k)


def test_embedder_is_normalised_and_cached_on_disk(embedder):
    a = embedder.encode(["hello world", "violin lessons"])
    assert a.dtype == np.float32 and np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    fresh = Embedder(cache_dir=embedder.cache_dir.parent)
    b = fresh.encode(["violin lessons", "hello world"])
    assert fresh._model is None  # served from the on-disk cache, model never loaded
    np.testing.assert_array_equal(b, a[::-1])


@pytest.fixture(scope="module")
def crowded(embedder):
    """The same report on five days, 20 days apart; the one on day 80 is the evidence, and
    its extra words make it the least similar of the five to the question, so the semantic
    channel ranks it fifth; the gold window (day 80, alone inside even with the 14-day
    buffer) is what finds it."""
    from tider.memory import MemoryCollection

    texts = ["Max chewed my new shoes", "We went hiking in the Alps"] * 5
    texts[4] = "Max chewed my new shoes out in the garden shed"
    msgs = [
        Message(id=i, key=f"D{i}", text=t, timestamp=T0 + timedelta(days=20 * i), speaker="Ann", session=f"s{i}")
        for i, t in enumerate(texts)
    ]
    day80 = Window(T0 + timedelta(days=80), T0 + timedelta(days=80))
    q = Query(
        "c:q0",
        "c",
        "What did Max chew?",
        T0 + timedelta(days=300),
        gold=Gold(evidence_ids=(4,), windows=(day80,), temporal=True),
    )
    return MemoryCollection({"c": Memory("c", msgs)}, RetrievalConfig(k=1), embedder=embedder), q


def test_store_coverage_is_what_the_windows_retrieve(crowded):
    store, q = crowded
    none = make_source("none").predict(q.public(), store)
    oracle = make_source("oracle", gold_by_key=gold_predictions([q])).predict(q.public(), store)
    ids, scores = store.retrieve(q.public(), none, 5)
    assert set(ids[:4].tolist()) == {0, 2, 6, 8} and ids[4] == 4 and np.all(np.diff(scores) <= 0)
    assert store.retrieve(q.public(), oracle, 1)[0].tolist() == [4]
    # coverage (the reward side's function) of what each prediction retrieves
    assert _coverage(store, q, none, 1) == 0.0 and _coverage(store, q, oracle, 1) == 1.0
    assert _coverage(store, q, none, 4) == 0.0 and _coverage(store, q, none, 5) == 1.0
    assert evidence_coverage(store.retrieve(q.public(), none, 1)[0].tolist(), [0], 1) == 1.0


def test_store_sources(toy):
    store, q = toy
    entries = store.timeline("toy").top_k(q.text, 2)
    assert len(entries) == 2 and entries[0].member_ids
    tl = make_source("timeline", top_m=2).predict(q.public(), store)
    assert tl.temporal and tl.windows == tuple(sorted({e.window for e in entries}))
    # seeds come from the store's BM25 index (name "Bo" matches even ids, 40 days apart): > eps, no windows
    assert make_source("dbscan-paper").predict(q.public(), store).temporal is False
    wide = make_source("dbscan", eps_days=45, mu_per_day=0.01, pad_days=0)
    pred = wide.predict(q.public(), store)
    assert pred.temporal and pred.windows
    # top-day: one window, the whole day of the semantic channel's top hit
    top = store.messages("toy")[int(store.ranking(q.public()).ids[0])].timestamp
    (day,) = make_source("top-day").predict(q.public(), store).windows
    assert day.start == top.replace(hour=0, minute=0, second=0, microsecond=0) and day.contains(top)
    assert (day.end - day.start).days == 0 and day.end.hour == 23
    # top-days: one such window on each of the first three distinct days the ranking hits
    days = []
    for i in store.ranking(q.public()).ids:
        d = store.messages("toy")[int(i)].timestamp.date()
        days += [d] if d not in days else []
    windows = make_source("top-days").predict(q.public(), store).windows
    assert [w.start.date() for w in windows] == sorted(days[:3]) and day in windows
    assert [w.start.date() for w in make_source("top-days", days=5).predict(q.public(), store).windows] == sorted(
        days[:5]
    )
    with pytest.raises(ValueError, match="days must be at least 1"):
        make_source("top-days", days=0)


@pytest.mark.slow
@pytest.mark.skipif(not LOCOMO.is_file(), reason="LoCoMo dev file not present")
def test_oracle_beats_none_on_a_locomo_slice():
    from tider.data import load_dataset
    from tider.eval.retrieval import eligible_queries, quick_eval
    from tider.memory import MemoryCollection

    full = load_dataset("locomo", str(LOCOMO))
    key = min(full.memories)
    queries = eligible_queries(full, memory_keys=[key], limit=80)
    store = MemoryCollection({key: full.memories[key]})
    oracle = quick_eval(store, make_source("oracle", gold_by_key=gold_predictions(queries)), queries)
    none = quick_eval(store, make_source("none"), queries)
    paper = quick_eval(store, make_source("dbscan-paper"), queries)
    assert oracle["recall@20"] >= none["recall@20"] + 0.1
    assert oracle["window_iou"] == 1.0 and none["windows_per_query"] == 0
    assert paper["windows_per_query"] > 2  # the session-timestamp pitfall: many windows per question


def test_empty_memory_is_a_clear_error(embedder):
    from tider.memory import MemoryCollection
    from tider.types import NON_TEMPORAL

    q = Query("q", "empty", "anything?", T0)
    store = MemoryCollection({"empty": Memory("empty", [])}, embedder=embedder)
    with pytest.raises(ValueError, match="memory 'empty' has no messages"):
        store.retrieve(q, NON_TEMPORAL, 5)
    with pytest.raises(KeyError, match="not in this collection"):
        store.messages("missing")
