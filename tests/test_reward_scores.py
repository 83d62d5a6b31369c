"""``tider.train.rewards.reward_scores``: completion texts scored by the reward callables
outside a trainer (what the bench scripts use), keyed by the registry names."""

from __future__ import annotations

import numpy as np
import pytest

from tider.train.examples import as_columns
from tider.train.rewards import make_rewards, reward_scores

GOOD = '{"temporal": true, "windows": [{"start": "2023-05-01", "end": "2023-05-03"}]}'
NO_TIME = '{"temporal": false, "windows": []}'
GARBAGE = "the window is early may"


def test_scores_each_reward_by_name_as_float_arrays():
    gold = [["2023-05-02", "2023-05-05"]]
    records = [
        {"prompt": [], "gold_windows": gold, "gold_temporal": True, "granularity": "day"},
        {"prompt": [], "gold_windows": [], "gold_temporal": False, "granularity": "day"},
    ]
    fns = make_rewards(["format", "switch", "window_iou"])
    # Two completions per prompt, in TRL's layout (as_columns repeats each record in a row).
    scores = reward_scores(fns, (GOOD, GARBAGE, NO_TIME, GOOD), as_columns(records, repeat=2))
    assert list(scores) == ["format", "switch", "window_iou"]
    for values in scores.values():
        assert isinstance(values, np.ndarray) and values.dtype == np.float64 and values.shape == (4,)
    assert scores["format"].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert scores["switch"].tolist() == [1.0, 0.0, 1.0, 0.0]
    # days {1,2,3} vs {2,3,4,5}: 2 shared of 5 -> 0.4; both non-temporal -> 1; one side only -> 0
    assert scores["window_iou"] == pytest.approx([0.4, 0.0, 1.0, 0.0])


def test_no_rewards_no_scores():
    assert reward_scores([], [GOOD], {"gold_windows": [[]]}) == {}
