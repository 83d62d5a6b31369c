"""Training data: by-conversation splits (no leaks), SFT/GRPO records, DAR."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tider.train.dar import dar_resample, effective_probabilities
from tider.train.examples import PromptBuilder, grpo_records, sft_records, split_keys, split_queries

LOCOMO_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo_dev.json"


def test_split_keys_deterministic_disjoint_and_complete():
    keys = [f"conv-{i}" for i in range(20)]
    a = split_keys(keys, seed=1)
    assert a == split_keys(list(reversed(keys)), seed=1)  # order of input does not matter
    assert a != split_keys(keys, seed=2)
    flat = a["train"] + a["validation"] + a["test"]
    assert sorted(flat) == sorted(keys) and len(set(flat)) == len(flat)
    assert (len(a["train"]), len(a["validation"]), len(a["test"])) == (16, 2, 2)
    small = split_keys(["x", "y", "z"], seed=0)
    assert all(len(v) == 1 for v in small.values())  # every split has a held-out memory
    with pytest.raises(ValueError, match="fractions"):
        split_keys(keys, fractions=(0.5, 0.5, 0.5))


@pytest.fixture(scope="module")
def small():
    from tider.data.synth import generate
    from tider.memory import MemoryCollection

    ds = generate(400, seed=5, n_conversations=4)
    return ds, MemoryCollection(ds.memories)


def test_queries_split_by_memory_never_by_query(small):
    ds, _ = small
    splits = split_queries(ds, seed=0)
    memories = {name: {q.memory_key for q in qs} for name, qs in splits.items()}
    assert not (memories["train"] & memories["validation"]) and not (memories["train"] & memories["test"])
    assert sum(len(v) for v in splits.values()) == len(ds.queries)


@pytest.mark.skipif(not LOCOMO_DEV.exists(), reason="LoCoMo dev data not present")
def test_locomo_dev_conversations_split_the_same_way():
    from tider.data import load_dataset

    ds = load_dataset("locomo", str(LOCOMO_DEV))
    splits = split_queries(ds, seed=0)
    assert splits["validation"] and splits["test"]
    keys = split_keys(ds.memories, seed=0)
    for name, qs in splits.items():
        assert {q.memory_key for q in qs} <= set(keys[name])


def test_records_carry_gold_only_in_completion_and_columns(small):
    ds, store = small
    builder = PromptBuilder(ds, store.timeline, top_k=8)
    queries = ds.queries[:12]
    sft = sft_records(queries, builder)
    grpo = grpo_records(queries, builder)
    for q, s, g in zip(queries, sft, grpo):
        assert s["prompt"] == g["prompt"] and [m["role"] for m in s["prompt"]] == ["system", "user"]
        target = json.loads(s["completion"][0]["content"])
        assert target["temporal"] == q.gold.temporal == g["gold_temporal"]
        assert len(target["windows"]) == g["n_gold_windows"] == (len(q.gold.windows) if q.gold.temporal else 0)
        assert g["evidence_ids"] == list(q.gold.evidence_ids) and g["memory_key"] == q.memory_key
        prompt_text = s["prompt"][1]["content"]
        assert q.text in prompt_text and prompt_text.count("\n[") <= 8
        if q.gold.answer and len(q.gold.answer) > 6:
            assert q.gold.answer not in prompt_text.split("Timeline:")[0]  # the question block never holds the answer


def test_dar_reproduces_tider_table_8():
    # Counts chosen so the empirical mix is the one behind TIDER Table 8's probabilities.
    counts = [0] * 16 + [1] * 424 + [2] * 160 + [3] * 40 + [5] * 24
    probs = effective_probabilities(counts)
    assert probs == pytest.approx({"0": 0.160, "1": 0.424, "2": 0.160, ">=3": 0.256}, abs=1e-9)
    records = [{"n_gold_windows": n, "i": i} for i, n in enumerate(counts)]
    drawn = dar_resample(records, seed=0, num_samples=20000)
    assert drawn == dar_resample(records, seed=0, num_samples=20000)
    share = Counter("0" if r["n_gold_windows"] == 0 else ">=3" if r["n_gold_windows"] >= 3 else str(r["n_gold_windows"]) for r in drawn)
    for bucket, p in probs.items():
        assert share[bucket] / 20000 == pytest.approx(p, abs=0.015)
    with pytest.raises(ValueError, match="known buckets"):
        effective_probabilities(counts, {"3": 2.0})
