"""The ``locator`` window source with local transformers generation (an untrained tiny
Qwen3: its completions are mostly malformed, which is what the failure path needs)."""

from __future__ import annotations

import json

import pytest

from tider.locator.sources import make_source
from tider.types import NON_TEMPORAL, WindowPrediction


def test_locator_source_needs_a_model_or_url(tmp_path):
    with pytest.raises(ValueError, match="model=PATH"):
        make_source("locator")
    with pytest.raises(ValueError, match="config.json"):
        make_source("locator", model=str(tmp_path))


def test_local_locator_predicts_or_falls_back_to_semantic(tiny_qwen3_dir, tmp_path):
    from tider.data.synth import generate
    from tider.memory import MemoryCollection

    (tmp_path / "ckpt").symlink_to(tiny_qwen3_dir, target_is_directory=True)
    (tmp_path / "tider_locator.json").write_text(json.dumps({"timeline_top_k": 3, "max_prompt_tokens": 2000,
                                                             "granularity": "day", "chat_template_kwargs": {}}))
    source = make_source("locator", model=str(tmp_path / "ckpt"), max_tokens=24)
    assert source.top_k == 3 and source.max_prompt_tokens == 2000 and source.granularity == "day"
    ds = generate(200, seed=1, n_conversations=1)
    store = MemoryCollection(ds.memories)
    queries = ds.queries[:5]
    preds = source.predict_batch([q.public() for q in queries], [ds.memories[q.memory_key] for q in queries],
                                 [store.timeline(q.memory_key) for q in queries])
    assert len(preds) == 5 and all(isinstance(p, WindowPrediction) for p in preds)
    for outcome, pred in zip(source.last_outcomes, preds):
        if outcome.failure:
            assert pred == NON_TEMPORAL
    assert sum(source.failures.values()) == sum(bool(o.failure) for o in source.last_outcomes)

