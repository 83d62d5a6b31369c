"""GRPO rewards: hand-computed values, malformed completions, registry behaviour, and the
retrieval-backed rewards against the real memories (tider.memory.MemoryCollection)."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from tider.scoring import answer_tokens
from tider.train import rewards as R
from tider.train.rewards import RewardContext, make_rewards, proximity_score
from tider.types import WindowPrediction

GOOD = '{"temporal": true, "windows": [{"start": "2023-05-01", "end": "2023-05-03"}]}'
NO_TIME = '{"temporal": false, "windows": []}'
BAD_DATE = '{"temporal": true, "windows": [{"start": "2023-13-01", "end": "2023-05-03"}]}'
GARBAGE = "the window is early may"


def _conv(text):  # TRL's conversational completion
    return [{"role": "assistant", "content": text}]


def _call(names, completions, gold_windows, gold_temporal, ctx=None, **extra):
    logged, extras = {}, {}
    fns = make_rewards(names, ctx or RewardContext())
    n = len(completions)
    columns = dict(gold_windows=gold_windows, gold_temporal=gold_temporal, granularity=["day"] * n, **extra)
    out = {}
    for f in fns:
        out[f.__name__] = f(
            prompts=[[]] * n,
            completions=[_conv(c) for c in completions],
            completion_ids=[[1]] * n,
            trainer_state=None,
            log_metric=logged.__setitem__,
            log_extra=lambda col, vals: extras.setdefault(col, []).extend(vals),
            **columns,
        )
    return out, logged, extras


def test_hand_computed_values_and_malformed_completions():
    gold = [["2023-05-02", "2023-05-05"]]
    out, logged, extras = _call(
        ["format", "switch", "window_iou", "proximity"],
        [GOOD, NO_TIME, BAD_DATE, GARBAGE, NO_TIME],
        [gold, gold, gold, gold, []],
        [True, True, True, True, False],
    )
    assert out["format"] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert out["switch"] == [1.0, 0.0, 0.0, 0.0, 1.0]
    # days {1,2,3} vs {2,3,4,5}: 2 shared of 5 covered -> 0.4; non-temporal vs gold windows -> 0;
    # both non-temporal -> 1 (scoring.window_iou's convention).
    assert out["window_iou"] == pytest.approx([0.4, 0.0, 0.0, 0.0, 1.0])
    assert out["proximity"] == pytest.approx([1.0, 0.0, 0.0, 0.0, 1.0])
    # Failure reasons counted once per batch, by the first configured reward.
    assert logged["parse/bad_date"] == pytest.approx(0.2)
    assert logged["parse/no_json"] == pytest.approx(0.2)
    assert logged["parse/failure_rate"] == pytest.approx(0.4)
    assert logged["parse/schema"] == 0.0
    assert extras["parse_failure"] == ["", "", "bad_date", "no_json", ""]


def test_proximity_is_smooth_across_the_window_edge():
    from datetime import datetime

    from tider.types import Window

    gold = [Window(datetime(2023, 5, 1), datetime(2023, 5, 3))]
    day = lambda d: [Window(datetime(2023, 5, d), datetime(2023, 5, d))]
    assert proximity_score(day(3), gold, "day", 7.0) == 1.0  # inside
    assert proximity_score(day(4), gold, "day", 7.0) == 1.0  # touching the last gold day
    # 05-10 starts 6 whole days after the gold ends (05-04 .. 05-09 in between).
    assert proximity_score(day(10), gold, "day", 7.0) == pytest.approx(2 / (1 + math.exp(6 / 7)))
    values = [proximity_score(day(d), gold, "day", 7.0) for d in range(4, 30)]
    assert all(a >= b for a, b in itertools.pairwise(values)) and values[-1] > 0
    # two predicted windows, one on gold, one far: the far one halves its side only
    two = day(2) + day(31)
    expected = 0.5 * (1.0 + 0.5 * (1.0 + 2 / (1 + math.exp(27 / 7))))
    assert proximity_score(two, gold, "day", 7.0) == pytest.approx(expected)


def test_registry_names_duplicates_and_unknown():
    fns = make_rewards(["window_iou", "format"])
    assert [f.__name__ for f in fns] == ["window_iou", "format"]
    from trl.trainer.utils import get_callable_name

    assert get_callable_name(fns[0]) == "window_iou"  # what TRL logs as rewards/<name>/mean
    with pytest.raises(ValueError, match="known rewards: .*format"):
        make_rewards(["format", "iou"])
    with pytest.raises(ValueError, match="already registered"):
        R.register_reward("format")(lambda completions, **kw: [])
    with pytest.raises(ValueError, match="repeat"):
        make_rewards(["format", "format"])


@pytest.fixture(scope="module")
def small_world():
    from tider.data.synth import generate
    from tider.memory import MemoryCollection

    ds = generate(400, seed=3, n_conversations=2)
    return ds, MemoryCollection(ds.memories)


def _gold_json(q, g="day"):
    from tider.types import WindowPrediction, format_time

    windows = [[format_time(w.start, g), format_time(w.end, g)] for w in q.gold.windows] if q.gold.temporal else []
    pred = WindowPrediction(q.gold.temporal, tuple(q.gold.windows) if q.gold.temporal else ())
    return json.dumps(pred.to_json(g)), windows


def test_evidence_coverage_and_answer_span_use_the_real_store(small_world):
    """Gold windows must retrieve more evidence than the semantic channel alone on the
    crowded synthetic data (that gap is what the locator is trained to close), and the
    rewards must see it: oracle completions score higher than non-temporal ones."""
    ds, store = small_world
    k = 5
    queries = [q for q in ds.queries if q.gold.temporal and q.gold.evidence_ids][:12]
    oracle_completions, golds = zip(*(_gold_json(q) for q in queries))
    n = len(queries)
    completions = list(oracle_completions) + [NO_TIME] * n + [GARBAGE]
    qs = queries + queries + queries[:1]
    ctx = RewardContext(dataset=ds, store=store, k=k)
    out, logged, _ = _call(
        ["evidence_coverage", "answer_span"],
        completions,
        [list(g) for g in golds] * 2 + [list(golds[0])],
        [True] * len(qs),
        ctx=ctx,
        query_key=[q.key for q in qs],
        memory_key=[q.memory_key for q in qs],
        evidence_ids=[list(q.gold.evidence_ids) for q in qs],
        answer=[q.gold.answer for q in qs],
    )
    oracle, semantic = out["evidence_coverage"][:n], out["evidence_coverage"][n : 2 * n]
    # Each value is the share of gold evidence among the ids the store retrieves for that prediction.
    for q, value in zip(queries, oracle):
        ids = store.retrieve(q.public(), WindowPrediction(True, tuple(q.gold.windows)), k)[0].tolist()
        assert value == pytest.approx(len(set(q.gold.evidence_ids) & set(ids)) / len(q.gold.evidence_ids))
    assert sum(oracle) / n > sum(semantic) / n + 0.2
    assert any(o == 1.0 and s < 1.0 for o, s in zip(oracle, semantic))
    assert out["evidence_coverage"][-1] == 0.0 and out["answer_span"][-1] == 0.0  # malformed -> 0
    assert logged["parse/no_json"] == pytest.approx(1 / len(qs))
    # answer_span: all evidence retrieved and every answer token in the evidence text -> 1.
    full = 0
    for q, cov, span in zip(queries, oracle, out["answer_span"][:n]):
        memory = ds.memories[q.memory_key]
        evidence_tokens = set(answer_tokens(" ".join(memory[i].text for i in q.gold.evidence_ids)))
        assert 0.0 <= span <= 1.0
        if cov == 1.0 and set(answer_tokens(q.gold.answer)) <= evidence_tokens:
            assert span == 1.0
            full += 1
    assert full > 0


def test_answer_correct_memoizes_reader_calls(small_world, tiny_qwen3_dir):
    from tider.llm.backends import LocalHFBackend
    from tider.llm.client import LLMClient

    ds, store = small_world
    reader = LLMClient(LocalHFBackend(str(tiny_qwen3_dir)), max_retries=0, default_max_tokens=8)
    ctx = RewardContext(dataset=ds, store=store, reader=reader)
    q = next(q for q in ds.queries if q.gold.temporal and q.gold.answer)
    text, gold = _gold_json(q)
    args = {
        "query_key": [q.key] * 3,
        "memory_key": [q.memory_key] * 3,
        "evidence_ids": [list(q.gold.evidence_ids)] * 3,
        "answer": [q.gold.answer] * 3,
    }
    out, _, _ = _call(["answer_correct"], [text, text, GARBAGE], [gold] * 3, [True] * 3, ctx=ctx, **args)
    assert out["answer_correct"][2] == 0.0 and all(0.0 <= v <= 1.0 for v in out["answer_correct"])
    assert out["answer_correct"][0] == out["answer_correct"][1]
    assert reader.usage_by_stage()["reward_reader"]["calls"] == 1  # same (query, retrieved ids): one call
    with pytest.raises(ValueError, match="answer_span"):
        _call(
            ["answer_correct"],
            [text],
            [gold],
            [True],
            ctx=RewardContext(dataset=ds, store=store),
            **{k: v[:1] for k, v in args.items()},
        )


def test_the_wide_window_shortcut_earns_less_than_a_precise_window(small_world):
    """locator-v1's GRPO found that one window spanning most of the year always holds the
    evidence (coverage paid in full, IoU ~0.1). Under the tiny recipe's rewards and weights
    that window must earn less, in expectation, than the gold windows; under v1's rewards it
    did not lose enough to matter (evidence_coverage paid it in full)."""
    from pathlib import Path

    import yaml

    recipe = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs/grpo/tiny-cpu.yaml").read_text())
    names, weights = recipe["reward_funcs"], recipe["reward_weights"]
    ds, store = small_world
    queries = [q for q in ds.queries if q.gold.temporal and q.gold.evidence_ids]
    span = next(iter(ds.memories.values())).span
    wide = json.dumps(
        {"temporal": True, "windows": [{"start": span.start.date().isoformat(), "end": span.end.date().isoformat()}]}
    )
    precise, golds = zip(*(_gold_json(q) for q in queries))
    n = len(queries)
    columns = {
        "query_key": [q.key for q in queries] * 2,
        "memory_key": [q.memory_key for q in queries] * 2,
        "evidence_ids": [list(q.gold.evidence_ids) for q in queries] * 2,
        "answer": [q.gold.answer for q in queries] * 2,
    }
    # a 200-message memory crowds k=5 as a year crowds k=20
    ctx = RewardContext(dataset=ds, store=store, k=5, default_source=recipe["reward_default_source"])
    out, _, _ = _call(
        names, list(precise) + [wide] * n, [list(g) for g in golds] * 2, [True] * 2 * n, ctx=ctx, **columns
    )
    total = [sum(w * out[name][i] for name, w in zip(names, weights)) for i in range(2 * n)]
    assert sum(total[:n]) / n > sum(total[n:]) / n + 1.0
    gain = out["evidence_advantage"]
    assert sum(gain[n:]) / n < 0.05 < sum(gain[:n]) / n  # the year-wide window adds nothing over the default source


def test_answer_correct_with_a_dead_reader_gives_counted_no_rewards(small_world):
    """A reader that stops answering mid-training: bounded retries per request, then the
    group's mean (``group_mean_fill``; ``None`` for a group with nothing scored), counted in
    reader/failures, and no hang (nothing listens on the port)."""
    import time

    from tider.llm.backends import OpenAIBackend
    from tider.llm.client import LLMClient
    from tider.llm.vllm_server import free_port

    ds, store = small_world
    backend = OpenAIBackend(f"http://127.0.0.1:{free_port()}/v1", "reader", timeout=2.0)
    reader = LLMClient(backend, max_retries=2, backoff=0.01)
    ctx = RewardContext(dataset=ds, store=store, reader=reader)
    q = next(q for q in ds.queries if q.gold.temporal and q.gold.answer)
    text, gold = _gold_json(q)
    args = {
        "query_key": [q.key] * 2,
        "memory_key": [q.memory_key] * 2,
        "evidence_ids": [list(q.gold.evidence_ids)] * 2,
        "answer": [q.gold.answer] * 2,
    }
    t0 = time.monotonic()
    out, logged, _ = _call(["answer_correct"], [text, GARBAGE], [gold] * 2, [True] * 2, ctx=ctx, **args)
    assert time.monotonic() - t0 < 30
    # the reader failed: scored as its group's mean (the unparsed completion's 0.0)
    assert out["answer_correct"] == [0.0, 0.0]
    assert logged["reader/failures"] == 1.0 and logged["reader/calls"] == 1.0
    assert logged["reader/f1_above_0"] == 0.0  # a failed call is not an answer
    usage = reader.usage_by_stage()["reward_reader"]
    assert usage["errors"] == 1 and usage["attempts"] == 3  # 1 call + 2 bounded retries
    # the failure is not cached: the next batch asks the reader again
    _call(["answer_correct"], [text], [gold], [True], ctx=ctx, **{k: v[:1] for k, v in args.items()})
    assert reader.usage_by_stage()["reward_reader"]["calls"] == 2


def test_reader_that_is_not_up_fails_fast_with_its_url():
    from tider.llm.vllm_server import free_port
    from tider.train.config import GRPOScriptArguments
    from tider.train.grpo import ReaderUnavailable, reader_client

    url = f"http://127.0.0.1:{free_port()}/v1"
    args = GRPOScriptArguments(
        reward_funcs=["format", "answer_correct"], reader_model="r", reader_base_url=url, reader_wait_timeout=2.0
    )
    with pytest.raises(ReaderUnavailable, match=url.replace(".", r"\.")):
        reader_client(args)
    assert reader_client(GRPOScriptArguments(reward_funcs=["format"])) is None


@pytest.mark.parametrize("default", ["top-days", "none"])
def test_evidence_advantage_is_relative_to_the_default_on_the_same_question(small_world, default):
    """Copying the default source earns exactly 0 on every question; gold windows earn what
    they retrieve beyond it; a malformed answer is scored as the semantic path serving would
    take (its loss to the default), not as 0; the oracle cannot be the default."""
    from tider.locator.sources import make_source
    from tider.scoring import evidence_coverage

    ds, store = small_world
    queries = [q for q in ds.queries if q.gold.temporal and q.gold.evidence_ids][:40]
    assert len(queries) >= 20
    ctx = RewardContext(dataset=ds, store=store, k=5, default_source=default)
    copied = [
        json.dumps(make_source(default).predict(q.public(), store).to_json("day")).replace("T00:00", "")
        for q in queries
    ]
    gold_texts, golds = zip(*(_gold_json(q) for q in queries))
    n = len(queries)
    columns = {
        "query_key": [q.key for q in queries] * 3,
        "memory_key": [q.memory_key for q in queries] * 3,
        "evidence_ids": [list(q.gold.evidence_ids) for q in queries] * 3,
    }
    out, _, _ = _call(
        ["evidence_advantage"],
        copied + list(gold_texts) + [GARBAGE] * n,
        list(golds) * 3,
        [True] * 3 * n,
        ctx=ctx,
        **columns,
    )
    adv = out["evidence_advantage"]
    assert adv[:n] == [0.0] * n  # matching the default earns nothing
    for q, got_gold, got_bad in zip(queries, adv[n : 2 * n], adv[2 * n :]):
        cov = {
            name: evidence_coverage(store.retrieve(q.public(), pred, 5)[0].tolist(), q.gold.evidence_ids, 5)
            for name, pred in [
                ("default", make_source(default).predict(q.public(), store)),
                ("gold", WindowPrediction(True, tuple(q.gold.windows))),
                ("none", WindowPrediction(False)),
            ]
        }
        assert got_gold == pytest.approx(cov["gold"] - cov["default"])
        assert got_bad == pytest.approx(cov["none"] - cov["default"])
    assert sum(adv[n : 2 * n]) > 0  # gold windows beat the default on the crowded synthetic data
    if default == "top-days":
        assert any(v != 0 for v in adv[2 * n :])  # the fallback is scored, not taken as a copy of the default
    with pytest.raises(ValueError, match="evaluation-only"):
        bad = RewardContext(dataset=ds, store=store, default_source="oracle")
        _call(["evidence_advantage"], [GARBAGE], [golds[0]], [True], ctx=bad, **{k: v[:1] for k, v in columns.items()})


def test_a_failed_reader_call_is_neither_rewarded_nor_penalized():
    """Issue 43 item 4, with TRL's aggregation (``sum_then_normalize``: weighted ``nansum``,
    then group centring and scaling): in a group where one completion's reader call failed,
    its advantage is what its other rewards alone give it. Left as ``None`` it would count as
    0 beside its group's scores."""
    import torch
    from trl.trainer.utils import nanstd

    weights = torch.tensor([0.5, 1.0, 1.0])  # format, window_iou, answer_correct
    format_, iou = [1.0, 1.0, 1.0, 0.0], [0.8, 0.4, 0.4, 0.0]
    answer = [0.9, None, 0.3, 0.0]  # the second completion's reader call failed

    def advantages(answer_column):
        per_func = torch.tensor([format_, iou, [math.nan if a is None else a for a in answer_column]]).T
        rewards = (per_func * weights).nansum(dim=1)  # TRL 1.16, GRPOTrainer._generate_and_score_completions
        centred = rewards - torch.nanmean(rewards)
        return centred, centred / (nanstd(rewards) + 1e-4)

    filled = R.group_mean_fill(answer, ["q"] * 4)
    assert filled[1] == pytest.approx(0.4)  # the mean of the three scored calls
    centred, adv = advantages(filled)
    others = weights[0] * torch.tensor(format_) + weights[1] * torch.tensor(iou)
    # the failed completion's answer term sits at its group's mean: its centred reward is its other rewards'
    assert centred[1].item() == pytest.approx((others[1] - others.mean()).item(), abs=1e-6)
    naive, _ = advantages(answer)  # None left in place: nansum makes it a 0 answer
    assert naive[1].item() < centred[1].item() - 0.3
    assert adv[1].item() == pytest.approx(
        centred[1].item() / (nanstd(others + weights[2] * torch.tensor(filled)).item() + 1e-4)
    )
    assert R.group_mean_fill([None, None, 0.5], ["a", "a", "b"]) == [None, None, 0.5]  # nothing scored in group a
