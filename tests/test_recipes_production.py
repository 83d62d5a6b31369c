"""The production recipes (configs/sft/qwen3-1.7b.yaml, configs/grpo/qwen3-1.7b*.yaml) run
for real, 1 step each, from the test-size tiny start (tests/recipetesting.py): the tiny
Qwen3 stands in for Qwen3-1.7B, `--use_cpu true` lifts the GPU requirement (bf16 stays
on), and a real vLLM server serving the tiny Qwen3 (tests/conftest.py) is the reader of
`answer_correct`. The production GRPO run also holds vLLM's sampling to the locator's JSON
shape (see LOCATOR_JSON)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from recipetesting import COMMON, ROOT, data_args, history, steps, tider

pytestmark = [pytest.mark.recipe, pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def production_sft(tiny_sft, recipe_work, recipe_data):
    out = recipe_work / "qwen3-sft"
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
        *data_args(recipe_data),
        *COMMON,
    )
    return out


def test_sft_qwen3_production(production_sft):
    args = json.loads((production_sft / "tider_locator.json").read_text())
    settings = args["prompt_settings"]  # the recipe's prompt settings
    assert settings["lines"]["max_lines"] == 30 and settings["max_prompt_tokens"] == 3584
    assert steps(production_sft) == [1]


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


# Completions the rewards can read from a model trained for one step: vLLM's structured
# output (TRL's `vllm_structured_outputs_regex`, not set by the recipe) holds generation to the
# locator's JSON with plausible dates, so the retrieval rewards and the reader really run
# (noise parses never, and every reward would score it 0 without reading it).
LOCATOR_JSON = (
    r'\{"temporal": (false, "windows": \[\]|true, "windows": \[\{"start": "2023-0[1-9]-(0[1-9]|1[0-9]|2[0-8])", '
    r'"end": "2023-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"\}\])\}'
)


@pytest.mark.vllm
def test_grpo_qwen3_production(production_sft, recipe_work, recipe_data, vllm_server):
    """vLLM colocated in the trainer generates the completions; `answer_correct` asks the
    served reader; DAR resamples. One step of the recipe's 4 prompts x G=8."""
    out = recipe_work / "qwen3-grpo"
    server_log = Path(vllm_server.log_path)
    served_before = server_log.read_text(errors="replace").count("POST /v1/chat/completions")
    tider(
        "grpo",
        "configs/grpo/qwen3-1.7b.yaml",
        "--model_name_or_path",
        str(production_sft),
        "--output_dir",
        str(out),
        "--max_steps",
        "1",
        "--use_cpu",
        "true",
        "--reader_base_url",
        vllm_server.base_url,
        "--reader_model",
        vllm_server.model_name,
        "--vllm_structured_outputs_regex",
        LOCATOR_JSON,
        *data_args(recipe_data),
        *COMMON,
    )
    [logged] = [h for h in history(out) if "loss" in h]
    # generation went through vLLM inside the trainer: TRL logs its sampling-vs-training logprob gap
    assert "sampling/sampling_logp_difference/mean" in logged, sorted(logged)
    recipe = yaml.safe_load((ROOT / "configs/grpo/qwen3-1.7b.yaml").read_text())
    for name in recipe["reward_funcs"]:
        assert f"rewards/{name}/mean" in logged, name
    # answer_correct rewards came from the served reader (its access log grew), failures counted
    assert logged["reader/calls"] > 0, logged
    assert server_log.read_text(errors="replace").count("POST /v1/chat/completions") > served_before
    assert json.loads((out / "dar.json").read_text())["factors"]["0"] == 10.0  # the paper's DAR factors
    assert json.loads((out / "tider_locator.json").read_text())["decoding"] == {
        "samples": recipe["answer_samples"],
        "temperature": recipe["temperature"],
        "min_votes": recipe["answer_min_votes"],
    }


@pytest.mark.vllm
def test_grpo_qwen3_multinode_server_mode(tiny_sft, recipe_work, recipe_data, tmp_path, vllm_server):
    """Server mode as scripts/slurm/train.slurm runs it, on one CPU box: the server gets
    `trl vllm-serve`'s flags (TRL's own command builder) and starts; its health check and
    generation answer TRL's client; the recipe's trainer connects to it. Weight sync stops
    there: TRL pushes weights through vLLM's NCCL weight-transfer engine, and every engine
    vLLM ships needs CUDA, so on CPU the trainer must fail with that reason, not hang."""
    from trl.generation.vllm_client import VLLMClient

    from tider.llm.vllm_server import VLLMServer, free_port, trl_server_flags

    port = free_port()
    server = VLLMServer(
        str(tiny_sft),
        port=port,
        extra_args=trl_server_flags(str(tiny_sft), port=port, cuda=False),
        env={**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        log_path=tmp_path / "trl-server.log",
        startup_timeout=300,
    )
    with server:
        client = VLLMClient(base_url=f"http://127.0.0.1:{port}", connection_timeout=60)  # check_server: /health
        out = client.generate(["2023-05-07 Alice"], n=2, max_tokens=8, temperature=0.7)
        assert len(out["completion_ids"]) == 2 and all(len(ids) > 0 for ids in out["completion_ids"])
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled"}
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "tider.cli",
                "grpo",
                "--config",
                str(ROOT / "configs/grpo/qwen3-1.7b-multinode.yaml"),
                "--model_name_or_path",
                str(tiny_sft),
                "--output_dir",
                str(recipe_work / "multinode"),
                "--max_steps",
                "1",
                "--use_cpu",
                "true",
                "--vllm_server_host",
                "127.0.0.1",
                "--vllm_server_port",
                str(port),
                "--reader_base_url",
                vllm_server.base_url,
                "--reader_model",
                vllm_server.model_name,
                *data_args(recipe_data),
                *COMMON,
            ],
            check=False,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert run.returncode != 0
    assert "weight sync" in run.stderr and "CUDA" in run.stderr, run.stderr[-4000:]
    assert "connected to the vLLM server" in run.stderr + run.stdout  # it got that far
