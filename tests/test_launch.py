"""Staging and the preflight (issue 43 items 1, 2, 6): `tider launch check` on the three
documented train.slurm forms prints the per-node plan and refuses a batch that does not
divide and a model that is not staged; `tider stage`, `tider serve` and `tider sft/grpo`
refuse at start, naming the model and the staging command. No network: a staged model is a
Hub cache laid out as huggingface_hub writes it (refs/main -> snapshots/<sha>)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHA = "0123456789abcdef0123456789abcdef01234567"


def stage_fake(hf_home: Path, *repo_ids: str) -> None:
    for repo_id in repo_ids:
        root = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
        (root / "snapshots" / SHA).mkdir(parents=True, exist_ok=True)
        (root / "snapshots" / SHA / "config.json").write_text("{}")
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / "main").write_text(SHA)


def tider(*args: str, hf_home: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", **env}
    full_env["PATH"] = f"{Path(sys.executable).parent}:{full_env['PATH']}"  # train.slurm calls `tider`
    return subprocess.run(
        [sys.executable, "-m", "tider.cli", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def check(recipe: str, nodes: int, gpus: int, *overrides: str, hf_home: Path, **env: str):
    """``tider launch check RECIPE --nodes N --gpus-per-node G [overrides]``."""
    return tider("launch", "check", recipe, "--nodes", str(nodes), "--gpus-per-node", str(gpus), *overrides,
                 hf_home=hf_home, **env)  # fmt: skip


@pytest.fixture
def staged(tmp_path) -> Path:
    """An HF_HOME with the production recipes' Hub models staged, and the SFT output the
    GRPO recipes start from (runs/qwen3-1.7b/sft, which the SFT job writes) as a folder."""
    hf_home = tmp_path / "hf"
    stage_fake(hf_home, "Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B")
    return hf_home


SFT_OUTPUT = ["--model_name_or_path", str(ROOT / "models" / "tiny-locator-v3")]  # stands in for runs/qwen3-1.7b/sft


def test_the_preflight_prints_the_plan_of_each_documented_form(staged):
    sft = check("configs/sft/qwen3-1.7b.yaml", 1, 8, hf_home=staged)
    assert sft.returncode == 0, sft.stderr[-3000:]
    assert "batch: 128 sequences an optimizer step" in sft.stdout  # 4 per device x 8 x 4 accumulation
    assert "model: policy Qwen/Qwen3-1.7B (staged in" in sft.stdout
    assert "[node-0] CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 accelerate launch" in sft.stdout

    one = check(
        "configs/grpo/qwen3-1.7b.yaml",
        1,
        8,
        *SFT_OUTPUT,
        hf_home=staged,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert "on 7 training processes" in one.stdout  # one GPU kept back for the reader
    assert "model: reader Qwen/Qwen3-8B (staged in" in one.stdout
    assert "[node-0] CUDA_VISIBLE_DEVICES=7 tider serve --skip-check --model Qwen/Qwen3-8B" in one.stdout

    three = check(
        "configs/grpo/qwen3-1.7b-multinode.yaml",
        3,
        8,
        *SFT_OUTPUT,
        hf_home=staged,
        VLLM_PORT="8100",
    )
    assert three.returncode == 0, three.stderr[-3000:]
    out = three.stdout
    assert "batch: 256 completions a generation = 32 prompts x 8 generations" in out
    assert "lengths: prompt 3584 + completion 256 + 64 (empty think block) = 3904 <= vllm_max_model_length 3904" in out
    assert "node-2:8100 (generation) and node-2:51216 (NCCL weight sync, vllm_group_port)" in out
    assert "keys: policy server none, reader none" in out
    assert "--max-model-len 3904" in out  # the recipe's length reaches the policy server
    assert out.count("--resume_from_checkpoint true") == 2  # a requeued job resumes by default
    for node in ("node-0", "node-1", "node-2"):
        assert f"[{node}] " in out


def test_the_preflight_refuses_a_batch_that_does_not_divide(staged):
    run = check(
        "configs/grpo/qwen3-1.7b-multinode.yaml",
        3,
        8,
        *SFT_OUTPUT,
        "--generation_batch_size",
        "96",
        hf_home=staged,
    )
    assert run.returncode == 2
    assert "generation_batch_size 96 is not divisible by the global batch 128" in run.stderr
    assert "accelerate launch" not in run.stdout  # no plan for a job that would fail


def test_the_preflight_refuses_a_model_that_is_not_staged(tmp_path):
    empty = tmp_path / "hf"
    run = check(
        "configs/grpo/qwen3-1.7b.yaml",
        1,
        8,
        *SFT_OUTPUT,
        hf_home=empty,
    )
    assert run.returncode == 2
    assert "the reader Qwen/Qwen3-8B is not staged" in run.stderr
    assert "tider stage configs/grpo/qwen3-1.7b.yaml" in run.stderr
    assert "tider serve" not in run.stdout
    # a GRPO recipe starts from the SFT job's output: a path not written yet is named as a path
    before_sft = check(
        "configs/grpo/qwen3-1.7b.yaml", 1, 8, "--model_name_or_path", "runs/never-written/sft", hf_home=tmp_path / "hf"
    )
    assert "the policy runs/never-written/sft does not exist here" in before_sft.stderr


def test_the_preflight_names_a_recipe_that_is_not_there(tmp_path):
    """The stage comes from the recipe's folder (no parse): a recipe missing there is said by
    name before anything is parsed or planned."""
    run = check("configs/grpo/no-such-recipe.yaml", 1, 8, hf_home=tmp_path / "hf")
    assert run.returncode == 2 and "configs/grpo/no-such-recipe.yaml: no such recipe file" in run.stderr, run.stderr
    assert "accelerate launch" not in run.stdout


def test_the_preflight_refuses_a_prompt_longer_than_the_engine(staged):
    run = tider(
        "launch",
        "verify",
        "grpo",
        "configs/grpo/qwen3-1.7b.yaml",
        "--processes",
        "7",
        *SFT_OUTPUT,
        "--vllm_max_model_length",
        "2048",
        hf_home=staged,
    )
    assert run.returncode == 2 and "> vllm_max_model_length 2048" in run.stderr, run.stderr[-2000:]


def test_training_and_serving_refuse_an_unstaged_model_at_start(tmp_path):
    empty = tmp_path / "hf"
    sft = tider(
        "sft",
        "--config",
        "configs/sft/qwen3-1.7b.yaml",
        "--use_cpu",
        "true",
        "--output_dir",
        str(tmp_path / "sft"),
        hf_home=empty,
    )
    assert sft.returncode != 0
    assert "tider sft: the policy Qwen/Qwen3-1.7B is not staged" in sft.stderr, sft.stderr[-2000:]
    assert "tider stage configs/sft/qwen3-1.7b.yaml" in sft.stderr
    serve = tider("serve", "--skip-check", "--model", "Qwen/Qwen3-8B", hf_home=empty)
    assert serve.returncode == 2
    assert "Qwen/Qwen3-8B is not staged" in serve.stderr and "tider stage --model Qwen/Qwen3-8B" in serve.stderr
    missing = tider("serve", "--model", str(tmp_path / "no-export"), "--skip-check", hf_home=empty)
    assert missing.returncode == 2 and "does not exist here" in missing.stderr  # not a Hub validation traceback


def test_stage_lists_what_a_recipe_needs_and_refuses_offline(tmp_path):
    run = tider("stage", "configs/grpo/qwen3-1.7b.yaml", hf_home=tmp_path / "hf")
    assert "configs/grpo/qwen3-1.7b.yaml: policy runs/qwen3-1.7b/sft" in run.stdout
    assert "configs/grpo/qwen3-1.7b.yaml: reader Qwen/Qwen3-8B" in run.stdout
    assert run.returncode == 2 and "HF_HUB_OFFLINE is set" in run.stderr
    local = tider("stage", "--model", "models/tiny-locator-v3", hf_home=tmp_path / "hf")
    assert local.returncode == 0 and "models/tiny-locator-v3: local folder" in local.stdout
