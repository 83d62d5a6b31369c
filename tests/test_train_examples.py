"""Training data: by-conversation splits (no leaks), SFT/GRPO records, DAR."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tider.data.splits import split_keys, split_queries, stratified_sample
from tider.train.dar import dar_resample, effective_probabilities
from tider.train.examples import PromptBuilder, gold_answer, grpo_records, option_answers, sft_records

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


def test_a_stratified_sample_keeps_every_stratum_in_proportion_in_every_split():
    # LongMemEval_s-like: 240 questions of 6 types, 40 of each; 48 drawn, 8 of each
    strata = {f"q{i:03d}": f"type{i // 40}" for i in range(240)}
    a = stratified_sample(strata, 48, seed=0)
    assert a == stratified_sample(dict(reversed(list(strata.items()))), 48, seed=0)  # input order does not matter
    assert a != stratified_sample(strata, 48, seed=1)
    flat = a["train"] + a["validation"] + a["test"]
    assert len(flat) == len(set(flat)) == 48 and set(flat) <= set(strata)
    drawn = Counter(strata[k] for k in flat)
    assert drawn == {f"type{j}": 8 for j in range(6)}
    for name, keys in a.items():  # a half, a fifth, the rest of each type: 4 / 2 / 2 of 8 (2 / 1.6 / 2.4)
        assert set(Counter(strata[k] for k in keys).values()) == ({4} if name == "train" else {2}), (name, keys)
    with pytest.raises(ValueError, match="n must be"):
        stratified_sample(strata, 241)


def test_a_fixed_split_names_its_held_out_memories():
    keys = [f"conv-{i}" for i in range(6)]
    fixed = split_keys(keys, seed=3, validation=["conv-5"], test=["conv-0", "conv-2"])
    assert fixed == {"train": ["conv-1", "conv-3", "conv-4"], "validation": ["conv-5"], "test": ["conv-0", "conv-2"]}
    with pytest.raises(ValueError, match=r"memories \['conv-9'\] are not in the data"):
        split_keys(keys, test=["conv-9"])
    with pytest.raises(ValueError, match="in both"):
        split_keys(keys, validation=["conv-1"], test=["conv-1"])


@pytest.fixture(scope="module")
def small():
    from tider.data.synth import generate
    from tider.memory import MemoryCollection
    from tider.retrieval.config import RetrievalConfig

    ds = generate(400, seed=5, n_conversations=4)
    # k=5 of 100 messages a memory: as in a full-size memory, the semantic top k often misses the evidence
    return ds, MemoryCollection(ds.memories, RetrievalConfig(k=5))


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
    from tider.locator.parse import parse_prediction
    from tider.locator.prompt import PromptSettings
    from tider.scoring import evidence_gain, window_iou
    from tider.types import NON_TEMPORAL

    ds, store = small
    builder = PromptBuilder(ds, store, settings=PromptSettings(options=True))
    queries = ds.queries  # 80: about one target in 80 is an option on this synthetic data
    sft = sft_records(queries, builder)
    grpo = grpo_records(queries, builder)
    committed = options = 0
    for q, s, g in zip(queries, sft, grpo):
        assert s["prompt"] == g["prompt"] and [m["role"] for m in s["prompt"]] == ["system", "user"]
        target = s["completion"][0]["content"]
        parsed = parse_prediction(target, granularity="day", refs=g["refs"])
        # the target commits to the gold windows unless they would retrieve less evidence than none
        assert parsed.ok and parsed.prediction.temporal == g["gold_temporal"]
        assert g["n_gold_windows"] == (len(q.gold.windows) if q.gold.temporal else 0)
        gain = builder.evidence_gains(q, builder.build(q))
        if parsed.prediction.temporal:
            committed += 1
            got, base = (store.retrieve(q.public(), p)[0] for p in (parsed.prediction, NON_TEMPORAL))
            assert evidence_gain(got, base, q.gold.evidence_ids, 5) >= 0
            if s["target"] == "gold":  # the references cover the gold windows, and they pay
                assert q.gold.temporal and window_iou(parsed.prediction.windows, q.gold.windows, "day") > 0
                assert g["gold_windows"] and len(g["gold_windows"]) == len(q.gold.windows)
            else:  # an option retrieves more than the gold references and than no window
                options += 1
                assert gain(json.loads(target)) > 0 and len(g["gold_windows"]) == len(parsed.prediction.windows)
        else:
            assert g["gold_windows"] == []
        # no listed option and not the gold references retrieve more than the target
        table = builder.build(q)
        for other in [gold_answer(q, table, "day"), *option_answers(table)]:
            if other["temporal"] and q.gold.evidence_ids:
                assert gain(other) <= max(gain(json.loads(target)), 0.0) + 1e-9, (q.key, other, target)
        assert g["evidence_ids"] == list(q.gold.evidence_ids) and g["memory_key"] == q.memory_key
        prompt_text = s["prompt"][1]["content"]
        assert q.text in prompt_text
        if q.gold.answer and len(q.gold.answer) > 6:
            assert q.gold.answer not in prompt_text.split("Timeline:")[0]  # the question block never holds the answer
    assert 0 < committed < len(queries)  # both kinds of target occur
    assert options > 0  # and some targets are options


def test_gold_answer_points_at_the_tightest_reference():
    from datetime import datetime

    from tider.locator.parse import Refs
    from tider.train.examples import gold_answer
    from tider.types import Gold, Query, Window

    day = lambda d: Window(datetime(2023, 5, d), datetime(2023, 5, d, 23, 59, 59, 999999))
    week = Window(datetime(2023, 5, 1), datetime(2023, 5, 7, 23, 59, 59, 999999))
    table = Refs(lines=(day(1), day(3), day(9)), cues=(week, day(9)), marks=(("H1", 3),))
    q = lambda *days: Query(
        "q", "m", "?", datetime(2023, 5, 10), gold=Gold(windows=tuple(day(d) for d in days), temporal=True)
    )
    assert gold_answer(q(3), table, "day") == {"temporal": True, "windows": [{"entry": 2}]}  # inside "last week"
    assert gold_answer(q(9), table, "day") == {"temporal": True, "windows": [{"cue": 2}]}  # the date itself
    # nothing in the prompt touches May 20: it cannot be pointed at, so no window
    assert gold_answer(q(20), table, "day") == {"temporal": False, "windows": []}
    assert gold_answer(q(1, 9), table, "day")["windows"] == [{"entry": 1}, {"cue": 2}]
    assert gold_answer(q(1, 20), table, "day")["windows"] == [{"entry": 1}]
    marked = Refs(lines=table.lines, cues=(), marks=(("H1", 3),))
    assert gold_answer(q(9), marked, "day")["windows"] == [{"mark": "H1"}]  # a line by its mark
    none = Query("q", "m", "?", datetime(2023, 5, 10), gold=Gold(temporal=False))
    assert gold_answer(none, table, "day") == {"temporal": False, "windows": []}


def test_reach_counts_what_the_prompt_can_express():
    """Issue 45 item 2: per question, gold windows a line or cue touches or covers exactly,
    and whether the target names them all; shares pooled and per dataset."""
    from datetime import datetime

    from tider.locator.parse import Refs
    from tider.train.examples import gold_answer, reach, reachability
    from tider.types import Gold, Query, Window

    day = lambda d: Window(datetime(2023, 5, d), datetime(2023, 5, d, 23, 59, 59, 999999))
    week = Window(datetime(2023, 5, 1), datetime(2023, 5, 7, 23, 59, 59, 999999))
    table = Refs(lines=(day(1), day(3)), cues=(week,), marks=())
    q = lambda key, *days: Query(
        key, "m" + key, "?", datetime(2023, 5, 10), gold=Gold(windows=tuple(day(d) for d in days), temporal=True)
    )
    rows = {}
    for query in (q("a", 3), q("b", 5), q("c", 1, 20)):
        rows[query.key] = reach(query, table, gold_answer(query, table, "day"), "day")
    assert rows["a"] == {"gold": 1, "touched": 1, "exact": 1, "whole": True, "abstain": False, "option": False}
    assert rows["b"] == {
        "gold": 1,
        "touched": 1,
        "exact": 0,
        "whole": True,
        "abstain": False,
        "option": False,
    }  # inside
    assert rows["c"] == {
        "gold": 2,
        "touched": 1,
        "exact": 1,
        "whole": False,
        "abstain": False,
        "option": False,
    }  # May 20
    assert reach(Query("n", "m", "?", datetime(2023, 5, 10), gold=Gold(temporal=False)), table, {}, "day") == {}
    records = [{"query_key": k, "reach": r} for k, r in rows.items()] + [{"query_key": "n", "reach": {}}]
    shares = reachability(records, {"one": ["ma", "mb"], "two": ["mc"]}, {k: "m" + k for k in "abcn"})
    assert shares["pooled"] == {
        "questions": 3,
        "gold_windows": 4,
        "gold_windows_touched": 0.75,
        "gold_windows_exact": 0.5,
        "targets_whole": pytest.approx(2 / 3),
        "targets_abstain": 0.0,
        "targets_option": 0.0,
        "targets_by_kind": {},
    }
    assert shares["one"]["questions"] == 2 and shares["two"]["gold_windows_touched"] == 0.5


def test_train_only_conversations_never_reach_validation_or_test(small):
    from tider.train.data import with_train_conversations

    ds, _ = small
    before = split_queries(ds, seed=0)
    more = with_train_conversations(ds, 2, seed=1000)
    after = split_queries(more, seed=0)
    assert after["validation"] == before["validation"] and after["test"] == before["test"]
    extra = set(more.memories) - set(ds.memories)
    assert len(extra) == 2 and {q.memory_key for q in after["train"]} >= extra
    with pytest.raises(ValueError, match="own seed"):
        with_train_conversations(ds, 1, seed=ds.stats["seed"])


def test_dar_reproduces_tider_table_8():
    # Counts chosen so the empirical mix is the one behind TIDER Table 8's probabilities.
    counts = [0] * 16 + [1] * 424 + [2] * 160 + [3] * 40 + [5] * 24
    probs = effective_probabilities(counts)
    assert probs == pytest.approx({"0": 0.160, "1": 0.424, "2": 0.160, ">=3": 0.256}, abs=1e-9)
    records = [{"n_gold_windows": n, "i": i} for i, n in enumerate(counts)]
    drawn = dar_resample(records, seed=0, num_samples=20000)
    assert drawn == dar_resample(records, seed=0, num_samples=20000)
    share = Counter(
        "0" if r["n_gold_windows"] == 0 else ">=3" if r["n_gold_windows"] >= 3 else str(r["n_gold_windows"])
        for r in drawn
    )
    for bucket, p in probs.items():
        assert share[bucket] / 20000 == pytest.approx(p, abs=0.015)
    with pytest.raises(ValueError, match="known buckets"):
        effective_probabilities(counts, {"3": 2.0})


def test_eval_queries_is_a_seeded_sample_in_split_order():
    from tider.train.data import eval_queries

    queries = list(range(100))
    sample = eval_queries(queries, 10, seed=0)
    assert len(sample) == 10 and sample == sorted(sample) and sample == eval_queries(queries, 10, seed=0)
    assert sample != queries[:10] and sample != eval_queries(queries, 10, seed=1)
    assert max(sample) > 50  # spread over the split, not its head
    assert eval_queries(queries, None, seed=0) == queries == eval_queries(queries, 500, seed=0)
