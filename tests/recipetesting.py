"""What the recipe tests share (tests/test_recipes.py, tests/test_recipes_production.py):
running ``tider sft|grpo --config RECIPE`` in a fresh process, reading what it logged, and
the chain of test-size models the recipes start from. The fixtures are session-scoped and
registered in tests/conftest.py, so both modules use one chain: the tiny start is built by
the pretrain recipes once, and the production recipes fine-tune it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--tiny_hidden_size", "64", "--tiny_num_layers", "2", "--tiny_num_heads", "2", "--tiny_vocab_size", "1024"]
COMMON = ["--report_to", "none", "--logging_steps", "1"]


def tider(stage: str, recipe: str, *overrides: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    run = subprocess.run(
        [sys.executable, "-m", "tider.cli", stage, "--config", str(ROOT / recipe), *overrides],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, f"{stage} {recipe} failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return run


def history(output_dir: Path) -> list[dict]:
    return json.loads((output_dir / "trainer_state.json").read_text())["log_history"]


def steps(output_dir: Path) -> list[int]:
    return [h["step"] for h in history(output_dir) if "loss" in h]


@pytest.fixture(scope="session")
def recipe_data(tmp_path_factory):
    from tider.data.synth import generate, write

    out = tmp_path_factory.mktemp("recipe-data") / "synthetic"
    write(generate(600, seed=0, n_conversations=3), str(out))
    return out


@pytest.fixture(scope="session")
def recipe_work(tmp_path_factory):
    return tmp_path_factory.mktemp("recipes")


def data_args(recipe_data: Path) -> list[str]:
    """The test-size synthetic data instead of the recipe's; a recipe's fixed split names real
    conversations and personas, which synthetic data has not, so it is cleared."""
    return [
        "--dataset_name",
        "synthetic",
        "--dataset_path",
        str(recipe_data),
        "--validation_memories",
        "",
        "--test_memories",
        "",
    ]


@pytest.fixture(scope="session")
def real_like(tmp_path_factory):
    """LoCoMo- and RealMem-format files with the names the fixed split of the real-data
    recipes lists (the real dev copies are not in the repository)."""
    from conftest import write_real_like

    return write_real_like(tmp_path_factory.mktemp("real-like"))


@pytest.fixture(scope="session")
def tiny_pretrain(recipe_work, real_like):
    """configs/sft/tiny-pretrain.yaml as written (its own training-only seeds, generated data)
    but at test size: fewer messages and train-only conversations, 2 steps. It builds the
    tiny Qwen3 the other recipes start from (as models/tiny-locator-v3 was built)."""
    out = recipe_work / "tiny-pretrain"
    tider(
        "sft",
        "configs/sft/tiny-pretrain.yaml",
        "--model_name_or_path",
        str(recipe_work / "base"),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--save_strategy",
        "no",
        "--synthetic_messages",
        "600",
        "--synthetic_conversations",
        "3",
        "--synthetic_train_conversations",
        "1",
        "--dataset_path",
        f",{real_like[1]}",  # the synthetic part is generated; RealMem's path is the recipe's data/realmem
        *TINY,
        *COMMON,
    )
    return out


@pytest.fixture(scope="session")
def tiny_pretrain_answer(tiny_pretrain, recipe_work, real_like):
    """configs/sft/tiny-pretrain-answer.yaml (the start's answer-only phase) from the above,
    with the same test-size data, 2 steps."""
    out = recipe_work / "tiny-pretrain-answer"
    tider(
        "sft",
        "configs/sft/tiny-pretrain-answer.yaml",
        "--model_name_or_path",
        str(tiny_pretrain),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--synthetic_messages",
        "600",
        "--synthetic_conversations",
        "3",
        "--synthetic_train_conversations",
        "1",
        "--dataset_path",
        f",{real_like[1]}",
        *COMMON,
    )
    return out


@pytest.fixture(scope="session")
def tiny_sft(tiny_pretrain_answer, recipe_work, recipe_data):
    """configs/sft/tiny-cpu.yaml, 2 steps, fine-tuning the pretrained start (the recipe names
    the shipped models/tiny-locator-v3; here the test-size one above)."""
    out = recipe_work / "tiny-sft"
    tider(
        "sft",
        "configs/sft/tiny-cpu.yaml",
        "--model_name_or_path",
        str(tiny_pretrain_answer),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--save_strategy",
        "no",
        *data_args(recipe_data),
        *COMMON,
    )
    return out
