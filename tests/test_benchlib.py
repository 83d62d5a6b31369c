"""bench/benchlib.py, the helpers the bench scripts share: the paired bootstrap behind the
README's intervals, and the benchmark designs as recipe overrides."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# Bench scripts run with bench/ on sys.path; here the module is loaded from its file.
_SPEC = importlib.util.spec_from_file_location("benchlib", ROOT / "bench" / "benchlib.py")
benchlib = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("benchlib", benchlib)  # its dataclasses resolve their module there
_SPEC.loader.exec_module(benchlib)


def test_constant_differences_have_a_point_interval():
    assert benchlib.paired_bootstrap_ci([0.0] * 50) == {"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0, "n": 50}
    ci = benchlib.paired_bootstrap_ci([0.25] * 7)
    assert ci["mean"] == ci["ci_low"] == ci["ci_high"] == 0.25 and ci["n"] == 7


def test_interval_of_a_known_sample():
    # 100 pairs, half 0 and half 1: mean 0.5, standard error 0.05, so the 95% interval is
    # about 0.5 -+ 1.96 * 0.05 = [0.402, 0.598].
    ci = benchlib.paired_bootstrap_ci([0.0, 1.0] * 50)
    assert ci["mean"] == 0.5 and ci["n"] == 100
    assert ci["ci_low"] == pytest.approx(0.402, abs=0.015) and ci["ci_high"] == pytest.approx(0.598, abs=0.015)
    assert ci["ci_low"] < ci["mean"] < ci["ci_high"]
    wider = benchlib.paired_bootstrap_ci([0.0, 1.0] * 50, alpha=0.01)
    assert wider["ci_low"] < ci["ci_low"] and wider["ci_high"] > ci["ci_high"]


def test_a_clear_gain_lies_above_zero_and_noise_straddles_it():
    rng = np.random.default_rng(1)
    gain = benchlib.paired_bootstrap_ci(rng.normal(0.3, 1.0, 400))
    assert 0 < gain["ci_low"] < gain["mean"] < gain["ci_high"]
    noise = benchlib.paired_bootstrap_ci(rng.normal(0.0, 1.0, 400))
    assert noise["ci_low"] < 0 < noise["ci_high"]


def test_seeded():
    diffs = np.random.default_rng(2).normal(0.1, 1.0, 60)
    assert benchlib.paired_bootstrap_ci(diffs, seed=5) == benchlib.paired_bootstrap_ci(list(diffs), seed=5)
    assert benchlib.paired_bootstrap_ci(diffs, seed=5) != benchlib.paired_bootstrap_ci(diffs, seed=6)


@pytest.mark.parametrize("design", sorted(benchlib.DESIGNS))
def test_every_design_is_a_valid_recipe_override(design):
    """bench_learning.py --design D runs the recipes with these overrides: they must parse
    (a design that needs a removed switch fails here, not an hour into a run)."""
    overrides = benchlib.data_overrides(benchlib.BENCHMARK_DATA, benchlib.DESIGNS[design])
    from tider.pipeline import Train

    script, _, _ = Train("grpo", ROOT / "configs/grpo/tiny-cpu.yaml", ROOT / "unused", None, overrides).parse()
    assert script.synthetic_messages == benchlib.BENCHMARK_DATA.synthetic_messages
    assert script.synthetic_train_conversations == (
        benchlib.BENCHMARK_DATA.train_conversations if benchlib.DESIGNS[design]["fresh"] else 0
    )


def test_grpo_minus_sft_pairs_the_rows_of_each_query():
    rows = {"sft": [{"composite": 0.5}, {"composite": 0.25}], "grpo": [{"composite": 0.75}, {"composite": 0.5}]}
    assert benchlib.grpo_minus_sft(rows) == benchlib.paired_bootstrap_ci([0.25, 0.25])
    assert benchlib.grpo_minus_sft({"sft": rows["sft"]}) is None  # --sft-only: no GRPO stage
    assert benchlib.grpo_minus_sft(rows, "sampled/composite") is None  # greedy only


@pytest.mark.slow
def test_the_held_out_greedy_row_is_greedy_when_the_checkpoint_votes(fixed_window_locator, tmp_path):
    """A GRPO checkpoint of the real-data recipes records a vote of 8 sampled completions;
    the held-out "greedy" row must still decode it greedily (one completion a query, the one
    greedy decoding writes), or GRPO - SFT compares one sample at T = 1 with SFT's greedy."""
    import json
    import shutil

    from tider.data import load_dataset
    from tider.memory.collection import MemoryCollection

    data, checkpoint = fixed_window_locator
    voting = tmp_path / "voting"
    shutil.copytree(checkpoint, voting)
    meta_path = voting / "tider_locator.json"
    meta = json.loads(meta_path.read_text())
    meta["decoding"] = {"samples": 8, "temperature": 1.0, "min_votes": 1}
    meta_path.write_text(json.dumps(meta))

    dataset = load_dataset("jsonl", str(data))
    store = MemoryCollection(dataset.memories)
    queries = list(dataset.queries)[:6]
    names, weights = ["format", "window_iou"], [1.0, 1.0]
    rows, texts = benchlib.held_out_rewards(voting, queries, dataset, store, names, weights)
    _, greedy = benchlib.held_out_rewards(checkpoint, queries, dataset, store, names, weights)
    assert texts == greedy and len(rows) == len(queries)
    assert all(text.count('"temporal"') == 1 for text in texts)  # one completion, not 8 joined
