"""Every recipe parses through TRL's own parser into SFTConfig/GRPOConfig + ModelConfig +
tider's script arguments, unknown keys fail, and the GRPO batch rule holds for the
accelerate configs' world sizes. No GPU needed: `--use_cpu true` only lifts the bf16 check."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tider.train.config import GRPOScriptArguments, LocatorScriptArguments, check_generation_batch, parse_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "configs").glob("sft/*.yaml")) + sorted((ROOT / "configs").glob("grpo/*.yaml"))
ACCELERATE = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))


def _stage(path: Path) -> str:
    return path.parent.name


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_parses_into_trl_configs(recipe):
    from trl import GRPOConfig, ModelConfig, SFTConfig

    script, training, model = parse_recipe(_stage(recipe), ["--config", str(recipe), "--use_cpu", "true"])
    raw = yaml.safe_load(recipe.read_text())
    assert isinstance(model, ModelConfig) and model.model_name_or_path == raw["model_name_or_path"]
    assert training.output_dir == raw["output_dir"]
    if _stage(recipe) == "sft":
        assert isinstance(training, SFTConfig) and type(script) is LocatorScriptArguments
    else:
        assert isinstance(training, GRPOConfig) and isinstance(script, GRPOScriptArguments)
        assert training.generation_batch_size % training.num_generations == 0
        assert len(training.reward_weights) == len(script.reward_funcs)
        for world in {1} | {yaml.safe_load(a.read_text())["num_processes"] for a in ACCELERATE}:
            assert check_generation_batch(training, world) % training.num_generations == 0
        from tider.train.rewards import known_rewards

        assert set(script.reward_funcs) <= set(known_rewards())


def test_production_grpo_follows_tider_table_7():
    _, t, _ = parse_recipe("grpo", ["--config", str(ROOT / "configs/grpo/qwen3-1.7b.yaml"), "--use_cpu", "true"])
    assert (t.beta, t.num_generations, t.temperature, t.learning_rate) == (0.1, 8, 0.7, 5e-6)
    assert t.lr_scheduler_type == "cosine" and t.warmup_steps == 0.1
    assert t.use_vllm and t.vllm_mode == "colocate" and t.bf16
    assert t.chat_template_kwargs == {"enable_thinking": False} and t.log_completions
    _, m, _ = parse_recipe(
        "grpo", ["--config", str(ROOT / "configs/grpo/qwen3-1.7b-multinode.yaml"), "--use_cpu", "true"]
    )
    assert m.vllm_mode == "server"


@pytest.mark.parametrize("name", ["qwen3-1.7b.yaml", "qwen3-1.7b-multinode.yaml"])
def test_production_grpo_is_sized_for_the_cluster(name):
    """vLLM's context holds the recipe's prompt and completion budgets, and the batch holds
    whole groups for the world train.slurm gives it (7 ranks beside the reader, or 16)."""
    script, t, _ = parse_recipe("grpo", ["--config", str(ROOT / "configs/grpo" / name), "--use_cpu", "true"])
    assert t.vllm_max_model_length >= script.max_prompt_tokens + t.max_completion_length
    for world in (7, 8, 16, 24):
        assert check_generation_batch(t, world) % t.num_generations == 0
    assert 0 < t.save_steps < 1  # a share of the run: fires whatever the data size


def test_unknown_recipe_keys_fail(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "configs/grpo/tiny-cpu.yaml").read_text() + "\nnot_a_field: 3\n")
    with pytest.raises(ValueError, match="not_a_field"):
        parse_recipe("grpo", ["--config", str(bad)])
    # a GRPO-only key is unknown to the SFT parser
    sft_bad = tmp_path / "sft_bad.yaml"
    sft_bad.write_text((ROOT / "configs/sft/tiny-cpu.yaml").read_text() + "\nreward_funcs: [format]\n")
    with pytest.raises(ValueError, match="reward_funcs"):
        parse_recipe("sft", ["--config", str(sft_bad)])
    with pytest.raises(ValueError, match="known stages"):
        parse_recipe("ppo", [])


def test_removed_options_fail_as_unknown_arguments(tmp_path):
    # The informative-prompt filter left src/ (issue 23; last in fa11d15): its switch is an unknown key now,
    # on the command line and in a recipe.
    recipe = ROOT / "configs/grpo/tiny-cpu.yaml"
    with pytest.raises(ValueError, match="--filter_samples"):
        parse_recipe("grpo", ["--config", str(recipe), "--filter_samples", "8"])
    old = tmp_path / "old.yaml"
    old.write_text(recipe.read_text() + "\nfilter_samples: 8\n")
    with pytest.raises(ValueError, match="filter_samples"):
        parse_recipe("grpo", ["--config", str(old)])
    assert not hasattr(GRPOScriptArguments(), "filter_samples")


def test_batch_rule_rejects_partial_groups():
    _, t, _ = parse_recipe("grpo", ["--config", str(ROOT / "configs/grpo/tiny-cpu.yaml")])
    t.per_device_train_batch_size, t.gradient_accumulation_steps, t.steps_per_generation = 3, 1, None
    with pytest.raises(ValueError, match="num_generations"):
        check_generation_batch(t, 1)


def test_cli_registers_training_commands():
    from tider.cli import build_parser

    parser = build_parser()
    args, extra = parser.parse_known_args(["grpo", "--config", "x.yaml", "--max_steps", "3"])
    assert args.stage == "grpo" and args.passthrough and extra == ["--max_steps", "3"]


# Where the data lives, what it is split into and where the reader LLM runs are each recipe's
# own; every other setting the production recipes share with the dataclasses has one default: theirs.
LOCAL_KEYS = {"dataset_name", "dataset_path", "validation_memories", "test_memories", "reader_model", "reader_base_url"}


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_dataclass_defaults_are_the_production_recipe(stage):
    from dataclasses import fields

    recipe = yaml.safe_load((ROOT / f"configs/{stage}/qwen3-1.7b.yaml").read_text())
    cls = LocatorScriptArguments if stage == "sft" else GRPOScriptArguments
    defaults = cls()
    shared = {f.name for f in fields(cls)} & set(recipe) - LOCAL_KEYS
    assert {"prompt_lines", "max_prompt_tokens"} <= shared
    assert {k: recipe[k] for k in shared} == {k: getattr(defaults, k) for k in shared}
    if stage == "grpo":
        assert defaults.reward_funcs == recipe["reward_funcs"]  # the shortcut-proof list
