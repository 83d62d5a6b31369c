"""Two training processes on CPU (gloo), launched the documented way:

    torchrun --nproc_per_node 2 -m tider.cli sft|grpo --config configs/.../tiny-cpu.yaml ...

(`accelerate launch --cpu --num_processes 2` starts ONE process on a CPU box; torchrun with
the recipes' `use_cpu: true` gives two ranks, DistributedType.MULTI_CPU.) Each rank logs
to OUTPUT/logs/rank{R}.log, which is what these tests read: the world size, the prompts
each rank's rewards scored, and which rank wrote the shared files. A run killed mid-way
resumes from its last complete checkpoint.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tider.llm.vllm_server import free_port

pytestmark = [pytest.mark.multiproc, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "--synthetic_messages",
    "600",
    "--synthetic_conversations",
    "3",
    "--prompt_lines",
    "4",
    "--max_prompt_tokens",
    "256",
    "--report_to",
    "none",
    "--logging_steps",
    "1",
]
TINY = ["--tiny_hidden_size", "64", "--tiny_num_layers", "2", "--tiny_num_heads", "2", "--tiny_vocab_size", "1024"]


def torchrun_argv(stage: str, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "tider.cli",
        stage,
        "--config",
        str(ROOT / f"configs/{stage}/tiny-cpu.yaml"),
        *SMALL,
        *overrides,
    ]


def env() -> dict:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }


def torchrun(stage: str, *overrides: str) -> None:
    run = subprocess.run(
        torchrun_argv(stage, *overrides), cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900, check=False
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]


def rank_logs(output_dir: Path) -> dict[int, str]:
    return {int(p.stem[4:]): p.read_text() for p in (output_dir / "logs").glob("rank*.log")}


def assert_two_ranks(logs: dict[int, str], stage: str) -> None:
    assert sorted(logs) == [0, 1]
    for rank, text in logs.items():
        assert f"{stage}: process {rank} of 2 (DistributedType.MULTI_CPU)" in text


@pytest.fixture(scope="module")
def two_rank_sft(tmp_path_factory):
    work = tmp_path_factory.mktemp("two-ranks")
    torchrun(
        "sft",
        "--model_name_or_path",
        str(work / "base"),
        "--output_dir",
        str(work / "sft"),
        "--max_steps",
        "30",
        "--learning_rate",
        "3e-3",
        "--completion_only_loss",
        "true",
        "--save_strategy",
        "no",
        *TINY,
    )
    return work


def test_sft_on_two_ranks(two_rank_sft):
    logs = rank_logs(two_rank_sft / "sft")
    assert_two_ranks(logs, "sft")
    # the tiny model is built once, by rank 0; the metadata is written by rank 0 only
    assert "building tiny Qwen3" in logs[0] and "building tiny Qwen3" not in logs[1]
    assert "tider_locator.json" in logs[0] and "tider_locator.json" not in logs[1]
    state = json.loads((two_rank_sft / "sft" / "trainer_state.json").read_text())
    assert state["global_step"] == 30


def test_grpo_on_two_ranks(two_rank_sft):
    out = two_rank_sft / "grpo"
    torchrun(
        "grpo",
        "--model_name_or_path",
        str(two_rank_sft / "sft"),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--save_strategy",
        "no",
    )
    logs = rank_logs(out)
    assert_two_ranks(logs, "grpo")
    scored = {}
    for rank, text in logs.items():
        batches = re.findall(rf"rewards on rank {rank}: (\d+) completions of prompts (\[.*\])", text)
        assert len(batches) == 2, text[-2000:]  # rewards ran on this rank at both steps
        assert all(int(n) == 16 for n, _ in batches)  # per_device_train_batch_size: 2 prompts x G=8
        scored[rank] = [set(ast.literal_eval(keys)) for _, keys in batches]
    for step in range(2):  # at every step the two ranks score different prompts (the batch is split, not copied)
        assert scored[0][step] and scored[1][step] and not (scored[0][step] & scored[1][step]), scored
    assert "dar.json" in logs[0] and "dar.json" not in logs[1]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any("frac_reward_zero_std" in h for h in history)


def test_killed_two_rank_run_resumes_from_its_checkpoint(two_rank_sft):
    out = two_rank_sft / "killed"
    argv = torchrun_argv(
        "sft",
        "--model_name_or_path",
        str(two_rank_sft / "base"),
        "--output_dir",
        str(out),
        "--max_steps",
        "60",
        "--save_steps",
        "10",
        "--save_total_limit",
        "2",
        *TINY,
    )
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 600
    try:
        while not (out / "checkpoint-10" / "trainer_state.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
            time.sleep(0.05)
    finally:
        # the launcher and both ranks, mid-run: each process of the run by name, since a rank
        # outlives its launcher's process group for a few steps (and would write checkpoints)
        family = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        for child in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        psutil.wait_procs(family, timeout=60)
        proc.wait(timeout=60)
    assert not (out / "trainer_state.json").exists() and not (out / "checkpoint-60").exists()  # killed mid-run
    torchrun(
        "sft",
        "--model_name_or_path",
        str(two_rank_sft / "base"),
        "--output_dir",
        str(out),
        "--max_steps",
        "60",
        "--save_steps",
        "10",
        "--save_total_limit",
        "2",
        "--resume_from_checkpoint",
        "true",
        *TINY,
    )
    logs = rank_logs(out)
    resumed = re.findall(r"resuming from .*checkpoint-(\d+)", logs[0])
    assert resumed and 10 <= int(resumed[-1]) < 60
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    steps = [h["step"] for h in history if "loss" in h]
    assert steps == list(range(1, 61))  # every step once: the resumed part continues the checkpoint's history
