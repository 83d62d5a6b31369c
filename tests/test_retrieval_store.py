"""MemoryCollection (the harness's memories), Embedder cache and window sources with the real MiniLM model."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from tider.eval.scoring import evidence_coverage
from tider.locator.sources import gold_predictions, make_source
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.embed import Embedder
from tider.types import Dataset, Gold, Memory, Message, Query, Window, WindowPrediction

LOCOMO = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "locomo" / "locomo_dev.json"
T0 = datetime(2023, 1, 2, 10, 0)
TEXTS = ["I adopted a puppy named Max", "We went hiking in the Alps", "My sister got married in June",
         "I started learning the violin", "Max chewed my new shoes", "The Alps trip was freezing",
         "Violin lessons are hard but fun", "The wedding cake was chocolate", "Max learned to sit",
         "Planning another hike next spring"]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return Embedder(cache_dir=tmp_path_factory.mktemp("emb"))


@pytest.fixture(scope="module")
def toy(embedder):
    msgs = [Message(id=i, key=f"D{i}", text=t, timestamp=T0 + timedelta(days=20 * i), speaker="Ann" if i % 2 else "Bo",
                    session=f"s{i}") for i, t in enumerate(TEXTS)]
    mem = Memory("toy", msgs)
    q = Query("toy:q0", "toy", "What did Max chew?", T0 + timedelta(days=300), user="Bo",
              gold=Gold(evidence_ids=(4, 8), windows=(Window(T0 + timedelta(days=80), T0 + timedelta(days=80)),),
                        temporal=True))
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


def test_store_retrieve_coverage_and_sources(toy):
    store, q = toy
    none = make_source("none").predict(q.public(), store.memory("toy"), store.timeline("toy"))
    ids, scores = store.retrieve(q, none, 3)
    assert len(ids) == 3 and np.all(np.diff(scores) <= 0)
    oracle = make_source("oracle", gold_by_key=gold_predictions([q]))
    assert _coverage(store, q, oracle.predict(q.public(), store.memory("toy"), None), 3) >= _coverage(store, q, none, 3)
    entries = store.timeline("toy").top_k(q.text, 2)
    assert len(entries) == 2 and entries[0].summary
    tl = make_source("timeline", top_m=2).predict(q.public(), store.memory("toy"), store.timeline("toy"))
    assert tl.temporal and 1 <= len(tl.windows) <= 2
    # seeds come from the store's BM25 index (name "Bo" matches even ids, 40 days apart): > eps, no windows
    assert make_source("dbscan-paper", store=store).predict(q.public(), store.memory("toy")).temporal is False
    wide = make_source("dbscan", store=store, eps_days=45, mu_per_day=0.01, pad_days=0)
    pred = wide.predict(q.public(), store.memory("toy"))
    assert pred.temporal and pred.windows


@pytest.mark.slow
@pytest.mark.skipif(not LOCOMO.is_file(), reason="LoCoMo dev file not present")
def test_oracle_beats_none_on_a_locomo_slice():
    from tider.data import load_dataset
    from tider.eval.retrieval import eligible_queries, quick_eval
    from tider.memory import MemoryCollection

    full = load_dataset("locomo", str(LOCOMO))
    key = sorted(full.memories)[0]
    queries = eligible_queries(full, memory_keys=[key], limit=80)
    store = MemoryCollection({key: full.memories[key]})
    oracle = quick_eval(store, make_source("oracle", gold_by_key=gold_predictions(queries)), queries)
    none = quick_eval(store, make_source("none"), queries)
    paper = quick_eval(store, make_source("dbscan-paper", store=store), queries)
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
        store.indexes("missing")
