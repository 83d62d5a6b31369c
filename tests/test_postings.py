"""The embedded store's BM25 postings: the scores bm25s gives over the same messages, bit for
bit, however the messages arrived (one add, many adds, a reload, a delete, an update)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tider import TemporalMemory
from tider.retrieval.bm25 import BM25Index, expand_message
from tider.retrieval.config import RetrievalConfig
from tider.retrieval.lexical import LexicalAnalysis
from tider.retrieval.postings import Postings

WORDS = [f"w{i}" for i in range(120)]


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    # empty texts too: bm25s indexes them as one placeholder term
    return [" ".join(rng.choices(WORDS, k=rng.randint(0, 25))) for _ in range(n)]


def queries(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS + ["unseen"], k=rng.randint(1, 6))) for _ in range(n)]


@pytest.mark.parametrize("parts", [1, 3, 40])
def test_postings_score_as_bm25s_however_the_rows_arrive(parts):
    analysis = LexicalAnalysis(stemmer="none")
    texts = corpus(800)
    reference = BM25Index.from_texts(texts, analysis=analysis)
    postings = Postings(analysis)
    for chunk in np.array_split(np.arange(len(texts)), parts):
        postings.add([analysis.terms(texts[i]) for i in chunk])
    for q in queries(100) + ["w3 w3 w3 w5"]:  # a repeated term counts per occurrence
        assert np.array_equal(postings.scores(q), reference.scores(q)), q


def test_postings_save_and_load(tmp_path):
    analysis = LexicalAnalysis()
    texts = ["we decided the launch", "launching on monday", "", "the budget was decided"]
    postings = Postings(analysis)
    postings.add([analysis.terms(t) for t in texts])
    postings.save(tmp_path / "p")
    loaded = Postings.load(tmp_path / "p")
    assert loaded.analysis == analysis and loaded.n_rows == 4
    assert np.array_equal(loaded.scores("decide launch"), postings.scores("decide launch"))


def test_removed_rows_score_zero_and_the_rest_as_if_never_added(tmp_path):
    """A delete takes rows out of the statistics (N, df, mean length): the survivors score
    as a fresh index over them does, bit for bit, and a save keeps the removal."""
    analysis = LexicalAnalysis(stemmer="none")
    texts = corpus(400, seed=3)
    postings = Postings(analysis)
    postings.add([analysis.terms(t) for t in texts])
    gone = sorted(random.Random(4).sample(range(400), 90)) + [0, 399]
    postings.remove(gone[:50])
    postings.remove(gone[40:])  # again, overlapping: removing a removed row is a no-op
    keep = [i for i in range(400) if i not in set(gone)]
    reference = BM25Index.from_texts([texts[i] for i in keep], analysis=analysis)
    postings.save(tmp_path / "p")
    for index in (postings, Postings.load(tmp_path / "p")):
        assert index.n_rows == 400 and index.n_live == len(keep)
        for q in queries(60):
            scores = index.scores(q)
            assert not scores[sorted(set(gone))].any(), q
            assert np.array_equal(scores[keep], reference.scores(q)), q


def _messages(texts: list[str], start: int = 0) -> list[dict]:
    return [
        {
            "key": f"m{start + i}",
            "text": t or "ok",
            "timestamp": f"2024-01-{1 + (start + i) // 40:02d}T{(start + i) % 24:02d}:00:00",
        }
        for i, t in enumerate(texts)
    ]


def _reference_scores(mem, query: str) -> np.ndarray:
    cfg = mem.config
    return BM25Index.from_messages(list(mem.messages().messages), cfg.metadata_fields, analysis=cfg.lexical()).scores(
        query
    )


def test_a_store_keeps_its_postings_through_adds_reload_delete_and_update(tmp_path):
    texts = corpus(300, seed=5)
    mem = TemporalMemory(tmp_path / "s")
    mem.add(_messages(texts[:200]))
    assert np.array_equal(mem.state.bm25().scores("w1 w2"), _reference_scores(mem, "w1 w2"))
    postings = mem.state._postings
    older = _messages(["w1 w7 a message from before every other"])
    older[0].update(key="old", timestamp="2023-12-31T00:00:00")  # lands at position 0
    mem.add(_messages(texts[200:], start=200) + older)
    assert mem.state._postings is postings  # grown in place, not rebuilt
    for q in ("w1 w2", "w7", "w1 w7 w9 w1"):
        assert np.array_equal(mem.state.bm25().scores(q), _reference_scores(mem, q)), q
    mem.close()
    mem = TemporalMemory(tmp_path / "s")
    assert np.array_equal(mem.state.bm25().scores("w1 w7"), _reference_scores(mem, "w1 w7"))
    mem.delete(["m3", "old"])
    mem.update("m10", text="w7 w7 w8")
    for q in ("w1 w7", "w8", "w7"):
        assert np.array_equal(mem.state.bm25().scores(q), _reference_scores(mem, q)), q


def test_another_bm25_method_is_rebuilt_after_an_add():
    mem = TemporalMemory(None, config=RetrievalConfig(bm25_method="robertson"))
    mem.add(_messages(corpus(50)))
    first = mem.state.bm25()
    mem.add(_messages(corpus(5, seed=9), start=50))
    second = mem.state.bm25()
    assert isinstance(second, BM25Index) and second is not first and second.n == 55
    msgs = list(mem.messages().messages)
    expected = BM25Index.from_texts(
        [expand_message(m) for m in msgs], method="robertson", analysis=mem.config.lexical()
    )
    assert np.array_equal(second.scores("w1 w3"), expected.scores("w1 w3"))
