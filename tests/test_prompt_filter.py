"""The informative-prompt filter (tider.train.prompt_filter) with the shipped tiny locator,
real transformers sampling and the recipe's real rewards on a small synthetic benchmark."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models/tiny-locator-v2"


@pytest.fixture(scope="module")
def setting():
    import torch

    from tider.llm.backends import LocalHFBackend
    from tider.train.config import parse_recipe
    from tider.train.examples import grpo_records
    from tider.train.grpo import reward_context
    from tider.train.locator_data import prepare
    from tider.train.rewards import make_rewards

    torch.set_num_threads(1)
    args, train, _ = parse_recipe(
        "grpo",
        [
            "--config",
            str(ROOT / "configs/grpo/tiny-cpu.yaml"),
            "--model_name_or_path",
            str(MODEL),
            "--synthetic_messages",
            "600",
            "--synthetic_conversations",
            "3",
        ],
    )
    dataset, store, _, builder, splits = prepare(args, str(MODEL), stage="grpo")
    records = grpo_records(splits["train"][:40], builder)
    rewards = make_rewards(args.reward_funcs, reward_context(args, dataset, store))
    backend = LocalHFBackend(
        str(MODEL), dtype="float32", batch_size=32, chat_template_kwargs=train.chat_template_kwargs
    )
    return records, backend, rewards, train.reward_weights


def test_keeps_exactly_the_prompts_whose_samples_differ_in_reward(setting):
    from tider.train.prompt_filter import informative_records, weighted_rewards

    records, backend, rewards, weights = setting
    kept, report = informative_records(
        records, backend, rewards, weights, samples=4, pool=16, temperature=1.0, max_tokens=48, seed=3
    )
    again, _ = informative_records(
        records, backend, rewards, weights, samples=4, pool=16, temperature=1.0, max_tokens=48, seed=3
    )
    assert [r["query_key"] for r in kept] == [r["query_key"] for r in again]  # seeded: same prompts every rank
    assert report["pool"] == 16 and report["kept"] == len(kept) and 0 < len(kept) < 16
    assert sum(report["kept_by_category"].values()) == len(kept)
    pool_keys = {r["query_key"] for r in records}
    assert {r["query_key"] for r in kept} <= pool_keys
    # The spread is the composite TRL computes: recompute one kept prompt's from its samples.
    texts = [c.text for c in backend.generate_batch([kept[0]["prompt"]] * 4, max_tokens=48, temperature=1.0, seed=5)]
    columns = {k: [kept[0][k]] * 4 for k in kept[0] if k not in ("prompt", "completion")}
    scores = weighted_rewards(rewards, weights, texts, columns)
    assert scores.shape == (4,) and np.all(scores >= 0)


def test_greedy_samples_never_differ_so_nothing_is_kept(setting):
    from tider.train.prompt_filter import informative_records

    records, backend, rewards, weights = setting
    with pytest.raises(ValueError, match="none of 8 prompts had a reward spread"):
        informative_records(records, backend, rewards, weights, samples=3, pool=8, temperature=0.0, max_tokens=48)
    with pytest.raises(ValueError, match="at least 2"):
        informative_records(records, backend, rewards, weights, samples=1, pool=8, temperature=1.0, max_tokens=48)
