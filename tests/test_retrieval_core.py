"""Retrieval building blocks on hand-built memories (no model load)."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest

from tider.locator.sources import (
    NoWindows,
    OracleWindows,
    ensure_not_evaluation_only,
    gold_predictions,
    make_source,
    register_source,
)
from tider.retrieval import channels
from tider.retrieval.bm25 import BM25Index, expand_message
from tider.retrieval.config import RetrievalConfig, TimelineConfig
from tider.retrieval.dense import FaissRows
from tider.retrieval.retriever import dual_channel_rank, fuse_ranks
from tider.retrieval.timeline import cluster_messages
from tider.types import Gold, Memory, Message, Query, Window, WindowPrediction

T0 = datetime(2023, 5, 1, 12, 0)


def _memory(n_days=10, per_day=3) -> Memory:
    msgs = [
        Message(
            id=i,
            key=f"m{i}",
            text=f"text {i}",
            timestamp=T0 + timedelta(days=i // per_day),
            speaker="A",
            session=f"s{i // per_day}",
        )
        for i in range(n_days * per_day)
    ]
    return Memory("mem", msgs)


def test_rank_fusion_hand_values():
    # pool of four messages: semantic ranks 1, 2, 3 and unranked; messages 2 and 3 are in the window
    pool = np.array([10, 11, 12, 13])
    sim = np.array([0.9, 0.8, 0.5, 0.0], dtype=np.float32)
    semantic_rank = np.array([1.0, 2.0, 3.0, np.inf])
    inside = np.array([False, False, True, True])
    ids, scores = fuse_ranks(pool, sim, semantic_rank, inside, rrf_k=60, k=4)
    scale = 61 / 2
    want = {10: scale / 61, 11: scale / 62, 12: scale * (1 / 63 + 1 / 61), 13: scale / 62}
    assert ids.tolist() == [12, 10, 13, 11]  # in both lists first; a tie (rank 2 in one list each) to the window
    assert scores == pytest.approx([want[i] for i in ids.tolist()])
    assert scores.max() <= 1.0


def test_window_to_id_range_matches_memory_bisect():
    mem = _memory()
    ts = np.array([channels.to_days(t) for t in mem.timestamps])
    for lo_day, hi_day in [(0, 0), (1, 3), (2.5, 2.6), (-5, -1), (9, 20)]:
        w = Window(T0 + timedelta(days=lo_day), T0 + timedelta(days=hi_day))
        want = mem.id_range(w)
        got = channels.id_ranges(ts, channels.window_days([w]))
        assert got == ([want] if want[1] > want[0] else [])
    # overlapping windows merge; the buffer widens both sides
    ws = [Window(T0, T0 + timedelta(days=1)), Window(T0 + timedelta(days=1), T0 + timedelta(days=2))]
    assert channels.id_ranges(ts, channels.window_days(ws)) == [(0, 9)]
    assert channels.id_ranges(
        ts, channels.window_days([Window(T0 + timedelta(days=5), T0 + timedelta(days=5))]), 1.0
    ) == [(12, 21)]


def test_bm25s_and_rank_bm25_rank_identically():
    corpus = [
        "the cat sat on the mat",
        "dogs chase cats in the park",
        "a violin concert in vienna",
        "my cat loves the violin",
        "hiking the alps in june",
        "june wedding cake with chocolate",
        "park rangers and alps guides",
        "chocolate cake recipe from vienna",
    ]
    fast = BM25Index.from_texts(corpus, backend="bm25s", method="robertson")
    ref = BM25Index.from_texts(corpus, backend="rank_bm25")
    for q in ["cat violin", "alps june hiking", "chocolate vienna", "park cats", "nothing matches zzz"]:
        a, b = fast.scores(q), ref.scores(q)
        # same Okapi formula; bm25s drops the constant (k1 + 1) factor of the numerator
        np.testing.assert_allclose(a * 2.5, b, rtol=1e-4, atol=1e-5)
        assert fast.search(q, 8)[0].tolist() == ref.search(q, 8)[0].tolist()


def test_metadata_expansion_and_save_load(tmp_path):
    m = Message(
        id=0,
        key="x",
        text="ship it friday",
        timestamp=T0,
        speaker="alice",
        session="s",
        channel="design",
        topic="release",
    )
    assert expand_message(m) == "ship it friday alice design release"
    idx = BM25Index.from_messages([m, Message(id=1, key="y", text="lunch", timestamp=T0, speaker="bob", session="s")])
    assert idx.search("what did alice say in design", 1)[0].tolist() == [0]
    idx.save(tmp_path / "bm25")
    again = BM25Index.load(tmp_path / "bm25")
    np.testing.assert_array_equal(again.scores("alice release"), idx.scores("alice release"))
    assert not list((tmp_path / "bm25").rglob("*.pkl"))


@pytest.mark.parametrize("hnsw_min", [0, 10**9])
def test_faiss_rows_past_selectors_and_roundtrip(hnsw_min, tmp_path):
    """Flat, and HNSW over whole chunks plus a flat tail; "only the past" as a row prefix
    and as a bitmap; a saved graph reloads and catches up with new rows."""
    from tider.retrieval.dense import CHUNK

    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(CHUNK + 300, 16)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = FaissRows(16, hnsw_min)
    index.add(vecs[:1000])
    index.add(vecs)  # catches up: rows 1000 ..
    assert index.n == len(vecs) and (index.hnsw is not None) == (hnsw_min == 0)
    q = vecs[7] + 0.01
    exact = np.argsort(-(vecs @ q), kind="stable")
    rows, _ = index.search(q, 5, None, ef_search=64)
    assert exact[0] in rows
    rows, _ = index.search(q, 50, 2000, ef_search=64)  # a prefix: rows < 2000
    assert len(rows) and rows.max() < 2000
    mask = np.zeros(len(vecs), dtype=bool)
    mask[CHUNK + 10 : CHUNK + 20] = True  # only tail rows
    mask[100:110] = True
    rows, _ = index.search(q, 50, mask, ef_search=64)
    assert set(rows.tolist()) <= set(np.flatnonzero(mask).tolist()) and len(rows) >= 10
    index.save(tmp_path / "dense")
    again = FaissRows.load(tmp_path / "dense", {"graph_rows": index.graph_rows}, 16, hnsw_min, 32, vecs)
    assert again.search(q, 5, None, 64)[0].tolist() == index.search(q, 5, None, 64)[0].tolist()


def test_timeline_clusters_by_time_similarity_and_cap():
    e = np.eye(4, dtype=np.float32)
    emb = np.stack([e[0], e[0], e[1], e[1], e[1], e[1]])
    ts = [T0, T0, T0, T0 + timedelta(days=1), T0 + timedelta(days=30), T0 + timedelta(days=30)]
    cfg = TimelineConfig(delta_date_days=7, theta_sem=0.9, cap=2)
    # topic change splits 1|2, the 30-day gap splits 3|4, the cap splits 0-1 | nothing else
    assert cluster_messages(ts, emb, cfg) == [[0, 1], [2, 3], [4, 5]]
    assert cluster_messages(ts, emb, TimelineConfig(theta_sem=0.9, cap=1)) == [[i] for i in range(6)]


def test_registry_errors_and_oracle_guard():
    with pytest.raises(ValueError, match="known: .*none.*oracle"):
        make_source("no-such-source")
    with pytest.raises(ValueError, match="already registered"):
        register_source("none")(NoWindows)
    q = Query("q", "mem", "when?", T0, gold=Gold(evidence_ids=(1,), windows=(Window(T0, T0),), temporal=True))
    oracle = make_source("oracle", gold_by_key=gold_predictions([q]))
    assert isinstance(oracle, OracleWindows)
    # gold comes from the mapping: the public query (no gold) still gets its windows
    assert oracle.predict(q.public(), None).windows == (Window(T0, T0),)
    with pytest.raises(ValueError, match="evaluation-only"):
        ensure_not_evaluation_only(oracle)
    ensure_not_evaluation_only(make_source("none"))


def test_dual_channel_promotes_in_window_evidence_and_non_temporal_is_semantic():
    mem = _memory(n_days=30, per_day=2)  # 60 messages, 2 a day

    def unit(x):
        return np.array(x, dtype=np.float32) / np.linalg.norm(x)

    vecs = np.tile(unit([0, 0, 0, 1]), (60, 1))  # unrelated to the query: cosine 0
    vecs[:4] = unit([0.9, np.sqrt(1 - 0.81), 0, 0])  # day 0-1: similar distractors (cos 0.9)
    vecs[40] = unit([0.3, 0, np.sqrt(1 - 0.09), 0])  # day 20: the weakly similar evidence (cos 0.3)
    vecs[41] = unit([1, 0, 0, 0])  # day 20: the best semantic match
    query = unit([1, 0, 0, 0])
    cfg = RetrievalConfig(k=5, semantic="dense")
    ts_days = np.array([channels.to_days(t) for t in mem.timestamps])
    sim = channels.semantic_similarity(vecs @ query, None, "dense")
    ids, _ = dual_channel_rank(sim, ts_days, WindowPrediction(False), cfg, 5)
    assert ids.tolist() == channels.top_k(sim, 5).tolist()
    day20 = T0 + timedelta(days=20)
    ids_w, scores_w = dual_channel_rank(sim, ts_days, WindowPrediction(True, (Window(day20, day20),)), cfg, 5)
    assert 40 not in ids.tolist() and 40 in ids_w.tolist()  # the window recovers the weak evidence
    # 41 leads both channels (score 1); 40 is second in the window and sixth semantically, so
    # it passes the distractors, which keep the rest of the top k: a window promotes, never takes over
    assert ids_w.tolist() == [41, 40, 0, 1, 2] and scores_w[0] == pytest.approx(1.0)
    assert np.all(np.diff(scores_w) <= 0)
    # temporal=False in the config forces the semantic path even with windows
    off = RetrievalConfig(k=5, semantic="dense", temporal=False)
    assert (
        dual_channel_rank(sim, ts_days, WindowPrediction(True, (Window(day20, day20),)), off, 5)[0].tolist()
        == ids.tolist()
    )


def test_hybrid_similarity_is_rrf():
    dense = np.array([0.9, 0.1, 0.5])
    bm25 = np.array([0.0, 3.0, 1.0])
    sim = channels.semantic_similarity(dense, bm25, "hybrid", rrf_k=60)
    want = [(1 / 61 + 1 / 63) * 61 / 2, (1 / 63 + 1 / 61) * 61 / 2, (1 / 62 + 1 / 62) * 61 / 2]
    np.testing.assert_allclose(sim, want, rtol=1e-6)
    with pytest.raises(ValueError, match="semantic mode .sparse. unknown"):
        RetrievalConfig(semantic="sparse")


def test_config_yaml_spells_out_the_defaults():
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parents[1] / "configs" / "retrieval" / "default.yaml"
    assert RetrievalConfig.from_json(yaml.safe_load(path.read_text())) == RetrievalConfig()
    with pytest.raises(ValueError, match="unknown retrieval config keys"):
        RetrievalConfig.from_json({"lambda": 1})


def test_removed_fusion_settings_load_at_their_old_defaults_only():
    # a store manifest written before rank fusion holds TIDER's rerank settings at their defaults
    old = {"lambda_boost": 0.3, "gamma_min": 0.3, "rho_per_day": 0.05, "tau_buf_days": 14.0, "k": 10}
    assert RetrievalConfig.from_json(old) == RetrievalConfig(k=10)
    with pytest.raises(ValueError, match="lambda_boost=10.0 .* commit fa11d15 is the last"):
        RetrievalConfig.from_json({"lambda_boost": 10.0})


def test_a_window_never_takes_over_the_top_k():
    """Each channel nominates its top k: a window whose messages the semantic channel ranks
    low takes at most half of the top k, and the semantic channel keeps its best half."""
    rng = np.random.default_rng(0)
    mem = _memory(n_days=50, per_day=4)
    ts_days = np.array([channels.to_days(t) for t in mem.timestamps])
    for k in (1, 2, 5, 20):
        sim = rng.random(len(mem)).astype(np.float32)
        day = T0 + timedelta(days=int(rng.integers(0, 50)))
        window = WindowPrediction(True, (Window(day, day + timedelta(hours=23)),))
        inside = set(range(*mem.id_range(window.windows[0])))
        ids, _ = dual_channel_rank(sim, ts_days, window, RetrievalConfig(k=k), k)
        semantic = channels.top_k(sim, k).tolist()
        assert len(ids) == k
        assert sum(i in inside and i not in semantic for i in ids.tolist()) <= (k + 1) // 2
        assert set(semantic[: k // 2]) <= set(ids.tolist())
