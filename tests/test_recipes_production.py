"""The production SFT recipe's LoRA switch, run for real for 1 step from the test-size tiny
start (tests/recipetesting.py): the tiny Qwen3 stands in for Qwen3-1.7B, `--use_cpu true`
lifts the GPU requirement (bf16 stays on). The production recipes themselves run through
scripts/slurm/train.slurm, as a cluster runs them, in tests/test_slurm.py."""

from __future__ import annotations

import json

import pytest
import yaml
from recipetesting import COMMON, ROOT, data_args, tider

pytestmark = [pytest.mark.recipe, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_sft_qwen3_production_lora(tiny_sft, recipe_work, recipe_data):
    """The recipe's documented LoRA switch (`use_peft: true`, its lora_r/alpha/targets)."""
    out = recipe_work / "qwen3-sft-lora"
    tider(
        "sft",
        "configs/sft/qwen3-1.7b.yaml",
        "--model_name_or_path",
        str(recipe_work / "base"),
        "--output_dir",
        str(out),
        "--max_steps",
        "1",
        "--use_cpu",
        "true",
        "--use_peft",
        "true",
        *data_args(recipe_data),
        *COMMON,
    )
    adapter = json.loads((out / "adapter_config.json").read_text())
    recipe = yaml.safe_load((ROOT / "configs/sft/qwen3-1.7b.yaml").read_text())
    assert adapter["r"] == recipe["lora_r"] and adapter["lora_alpha"] == recipe["lora_alpha"]
    assert set(adapter["target_modules"]) == set(recipe["lora_target_modules"])
