"""Every shipped recipe runs for real: each file under configs/sft and configs/grpo goes
through `tider sft|grpo --config RECIPE` (a fresh process, as a user runs it) for 1-2
steps. This module: the tiny recipes (pretrain, the demo's, the real-data ones);
tests/test_recipes_production.py: the Qwen3-1.7B ones. What the tests override, and why:

- the model: the recipes' tiny Qwen3 (built by configs/sft/tiny-pretrain.yaml), at test
  size (hidden 64, 2 layers): Qwen3-1.7B weights cannot be downloaded here;
- the data: a small embedded synthetic benchmark written to disk (LoCoMo is a download);
- the step count (1-2), `--use_cpu true` for the GPU recipes (no GPU here; bf16 stays on),
  `--report_to none`, and the reader URL/name of `answer_correct`: a real vLLM server
  serving the tiny Qwen3 (tests/conftest.py), which checks the wiring, not its answers.

Everything else is the recipe: vLLM colocated inside the trainer (`use_vllm: true`), DAR,
the reward list and weights, gradient checkpointing, LoRA through `use_peft`. The helpers
and the chain of test-size models are in tests/recipetesting.py.
"""

from __future__ import annotations

import json

import pytest
import yaml
from recipetesting import COMMON, ROOT, data_args, history, steps, tider

# Generous per-test bound: a fixture trains first, and CI machines may be shared.
pytestmark = [pytest.mark.recipe, pytest.mark.slow, pytest.mark.timeout(1800)]

RECIPES = sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").glob("*/*.yaml") if p.parent.name in ("sft", "grpo")
)


def test_every_recipe_has_a_test():
    tested = {
        "configs/sft/tiny-cpu.yaml",
        "configs/sft/tiny-pretrain.yaml",
        "configs/sft/tiny-pretrain-answer.yaml",
        "configs/grpo/tiny-cpu.yaml",
        "configs/sft/tiny-real.yaml",
        "configs/grpo/tiny-real.yaml",
        "configs/sft/qwen3-1.7b.yaml",
        "configs/grpo/qwen3-1.7b.yaml",
        "configs/grpo/qwen3-1.7b-multinode.yaml",
    }
    assert set(RECIPES) == tested, "a new recipe needs a test in test_recipes*.py"


def test_sft_tiny_pretrain(tiny_pretrain, recipe_work):
    from tider.locator.contract import LocatorMetadata

    assert (recipe_work / "base" / "config.json").exists() and steps(tiny_pretrain) == [1, 2]
    recipe = yaml.safe_load((ROOT / "configs/sft/tiny-pretrain.yaml").read_text())
    assert recipe["dataset_seed"] >= 1000 and recipe["synthetic_train_seed"] >= 1000  # disjoint from evaluations
    meta = LocatorMetadata.read(tiny_pretrain)
    assert meta.prompt_settings["lines"]["max_lines"] == recipe["prompt_lines"]
    assert meta.dataset_name == "synthetic+realmem" and meta.test_memories == recipe["test_memories"]


def test_sft_tiny_pretrain_answer(tiny_pretrain_answer, tiny_pretrain):
    from tider.locator.contract import LocatorMetadata

    assert steps(tiny_pretrain_answer) == [1, 2]
    recipe = yaml.safe_load((ROOT / "configs/sft/tiny-pretrain-answer.yaml").read_text())
    assert recipe["completion_only_loss"] is True and recipe["model_name_or_path"] == "runs/tiny-pretrain/sft"
    first, second = LocatorMetadata.read(tiny_pretrain), LocatorMetadata.read(tiny_pretrain_answer)
    # the same data and prompt as the first phase: one start, two phases
    assert second.training_data_hash == first.training_data_hash and second.prompt_settings == first.prompt_settings


def test_sft_tiny_cpu(tiny_sft):
    assert steps(tiny_sft) == [1, 2] and (tiny_sft / "tider_locator.json").exists()
    assert json.loads((tiny_sft / "config.json").read_text())["dtype"] in ("float32", "bfloat16")  # dtype: auto
    assert len((tiny_sft / "metrics.jsonl").read_text().splitlines()) >= 2  # per-step metrics go to the file
    recipe = yaml.safe_load((ROOT / "configs/sft/tiny-cpu.yaml").read_text())
    assert (ROOT / recipe["model_name_or_path"] / "config.json").exists()  # the shipped starting point


def test_grpo_tiny_cpu(tiny_sft, recipe_work, recipe_data):
    out = recipe_work / "tiny-grpo"
    run = tider(
        "grpo",
        "configs/grpo/tiny-cpu.yaml",
        "--model_name_or_path",
        str(tiny_sft),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--save_strategy",
        "no",
        *data_args(recipe_data),
        *COMMON,
    )
    recipe = yaml.safe_load((ROOT / "configs/grpo/tiny-cpu.yaml").read_text())
    logged = history(out)
    for name in recipe["reward_funcs"]:
        assert any(f"rewards/{name}/mean" in h for h in logged), name
    assert any("frac_reward_zero_std" in h for h in logged)
    assert json.loads((out / "dar.json").read_text())["effective_probabilities"]
    assert "zero_std=" in run.stderr + run.stdout  # the progress line shows it
    assert "'loss'" not in run.stdout  # no per-step metrics dicts on the terminal


@pytest.fixture(scope="module")
def tiny_real(tiny_pretrain_answer, recipe_work, real_like):
    """configs/sft/tiny-real.yaml, 2 steps from the test-size start, on LoCoMo- and
    RealMem-format files that carry the names of its fixed split."""
    out = recipe_work / "tiny-real"
    tider(
        "sft",
        "configs/sft/tiny-real.yaml",
        "--model_name_or_path",
        str(tiny_pretrain_answer),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--dataset_path",
        f"{real_like[0]},{real_like[1]}",
        *COMMON,
    )
    return out


def test_sft_tiny_real(tiny_real):
    from tider.locator.contract import LocatorMetadata

    assert steps(tiny_real) == [1, 2]
    recipe = yaml.safe_load((ROOT / "configs/sft/tiny-real.yaml").read_text())
    meta = LocatorMetadata.read(tiny_real)
    assert meta.dataset_name == "locomo+realmem"
    assert (meta.validation_memories, meta.test_memories) == (recipe["validation_memories"], recipe["test_memories"])
    # the shipped start is the one the pretrain recipes make, and it never trained on these memories
    start = LocatorMetadata.read(ROOT / recipe["model_name_or_path"])
    assert set(start.test_memories or ()) <= set(recipe["test_memories"])


def test_grpo_tiny_real(tiny_real, recipe_work, real_like):
    out = recipe_work / "tiny-real-grpo"
    tider(
        "grpo",
        "configs/grpo/tiny-real.yaml",
        "--model_name_or_path",
        str(tiny_real),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--dataset_path",
        f"{real_like[0]},{real_like[1]}",
        *COMMON,
    )
    recipe = yaml.safe_load((ROOT / "configs/grpo/tiny-real.yaml").read_text())
    for name in recipe["reward_funcs"]:
        assert any(f"rewards/{name}/mean" in h for h in history(out)), name
    assert any("eval_reward" in h for h in history(out)), history(out)  # the validation reward, logged
    assert recipe["test_memories"] == yaml.safe_load((ROOT / "configs/sft/tiny-real.yaml").read_text())["test_memories"]
    # the served answer is the recipe's vote at the rollout temperature, recorded in the contract
    decoding = json.loads((out / "tider_locator.json").read_text())["decoding"]
    assert decoding == {"samples": 8, "temperature": recipe["temperature"], "min_votes": recipe["answer_min_votes"]}


def test_grpo_tiny_cpu_vllm_samples_from_the_trained_weights(recipe_work, recipe_data):
    """The colocated engine must generate with the weights of the current step. Pushed hard
    (lr 3e-3 from the shipped start) the policy moves far from its start (KL > 0.5), while
    the log-probabilities vLLM sampled with stay those of the trainer's own weights (TRL
    logs their difference): a stale engine would sample from the start, off by about the
    KL. On AVX-512 CPUs this failed outright before (vLLM dropped the packed weights' loaders;
    tider.train.grpo.compute_cpu_linears_on_live_weights)."""
    out = recipe_work / "tiny-grpo-moving"
    tider(
        "grpo",
        "configs/grpo/tiny-cpu.yaml",
        "--model_name_or_path",
        str(ROOT / "models/tiny-locator-v3"),
        "--output_dir",
        str(out),
        "--max_steps",
        "3",
        "--save_strategy",
        "no",
        "--learning_rate",
        "3e-3",
        "--lr_scheduler_type",
        "constant",
        "--warmup_steps",
        "0",
        *data_args(recipe_data),
        *COMMON,
    )
    last = [h for h in history(out) if "kl" in h][-1]
    assert last["kl"] > 0.5, last
    assert last["sampling/sampling_logp_difference/mean"] < 0.05, last


REALMEM = ROOT.parent / "shared" / "data" / "realmem"


@pytest.mark.slow
@pytest.mark.skipif(not REALMEM.is_dir(), reason="needs the RealMem dev copy at ../shared/data/realmem")
def test_shipped_starting_point_is_what_the_pretrain_recipe_trains_on():
    """models/tiny-locator-v3 records the hash of its training queries; the recipes' data as
    written (training-only synthetic seeds, checked disjoint from evaluations above, and the
    RealMem train personas) gives the same hash in both phases (tiny-pretrain, then
    tiny-pretrain-answer), and the same prompt settings."""
    from tider.data.splits import split_queries
    from tider.locator.contract import LocatorMetadata
    from tider.locator.prompt import PromptSettings
    from tider.train.config import parse_recipe
    from tider.train.data import fixed_split, load_training_dataset, training_data_hash

    meta = LocatorMetadata.read(ROOT / "models/tiny-locator-v3")
    first, second = (
        parse_recipe("sft", ["--config", str(ROOT / f"configs/sft/{r}.yaml"), "--dataset_path", f",{REALMEM}"])[0]
        for r in ("tiny-pretrain", "tiny-pretrain-answer")
    )
    data_fields = (
        "dataset_name",
        "dataset_seed",
        "split_seed",
        "validation_memories",
        "test_memories",
        "synthetic_messages",
        "synthetic_conversations",
        "synthetic_train_conversations",
        "synthetic_train_seed",
    )
    assert [getattr(first, f) for f in data_fields] == [getattr(second, f) for f in data_fields]
    dataset = load_training_dataset(first)
    train = split_queries(dataset, first.split_seed, **fixed_split(first))["train"]
    assert meta.training_data_hash == training_data_hash(dataset, [q.key for q in train])
    for script_args in (first, second):
        assert PromptSettings.from_json(meta.prompt_settings) == script_args.prompt_settings()
