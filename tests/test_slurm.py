"""scripts/slurm/train.slurm in dry-run mode: what each node of a simulated allocation
runs. Server mode: the last node serves (`trl vllm-serve`), the others train with one
machine rank each and find the server by --vllm_server_host; colocate: every node trains."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NODES = ["gpu-a", "gpu-b", "gpu-c"]


def dry_run(*args: str, nodes=NODES) -> tuple[int, dict[str, list[str]], str]:
    env = {**os.environ, "TIDER_DRY_RUN": "1", "TIDER_DRY_RUN_NODES": " ".join(nodes)}
    run = subprocess.run(
        ["bash", "scripts/slurm/train.slurm", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    per_node: dict[str, list[str]] = {}
    for line in run.stdout.splitlines():
        m = re.match(r"\[(\S+)\] (.*)", line)
        if m:
            per_node.setdefault(m.group(1), []).append(m.group(2))
    return run.returncode, per_node, run.stdout + run.stderr


def flag(command: str, name: str) -> str:
    return re.search(rf"{name} (\S+)", command).group(1)


def test_server_mode_last_node_serves_the_others_train():
    recipe = "configs/grpo/qwen3-1.7b-multinode.yaml"
    rc, per_node, out = dry_run("grpo", recipe, "zero2", "--max_steps", "5")
    assert rc == 0, out
    assert set(per_node) == set(NODES) and all(len(v) == 1 for v in per_node.values())
    [server] = per_node["gpu-c"]
    model = yaml.safe_load((ROOT / recipe).read_text())["model_name_or_path"]
    assert server.startswith("trl vllm-serve") and flag(server, "--model") == model
    assert flag(server, "--host") == "0.0.0.0" and flag(server, "--port") == "8000"
    assert int(flag(server, "--tensor_parallel_size")) * int(flag(server, "--data_parallel_size")) == 8
    for rank, node in enumerate(["gpu-a", "gpu-b"]):
        [train] = per_node[node]
        assert train.startswith("accelerate launch") and f"-m tider.cli grpo --config {recipe}" in train
        assert flag(train, "--machine_rank") == str(rank) and flag(train, "--num_machines") == "2"
        assert flag(train, "--num_processes") == "16" and flag(train, "--main_process_ip") == "gpu-a"
        assert flag(train, "--vllm_server_host") == "gpu-c" and flag(train, "--vllm_server_port") == "8000"
        assert "--max_steps 5" in train  # extra arguments reach the trainer


def test_colocate_and_sft_train_on_every_node():
    for stage, recipe in (("grpo", "configs/grpo/qwen3-1.7b.yaml"), ("sft", "configs/sft/qwen3-1.7b.yaml")):
        rc, per_node, out = dry_run(stage, recipe, "zero3")
        assert rc == 0, out
        assert set(per_node) == set(NODES) and "vllm-serve" not in out
        ranks = sorted(flag(per_node[n][0], "--machine_rank") for n in NODES)
        assert ranks == ["0", "1", "2"]
        assert all(flag(per_node[n][0], "--config_file") == "configs/accelerate/zero3.yaml" for n in NODES)
        assert all(flag(per_node[n][0], "--num_processes") == "24" for n in NODES)


def test_server_mode_on_one_node_is_refused():
    rc, per_node, out = dry_run("grpo", "configs/grpo/qwen3-1.7b-multinode.yaml", "zero2", nodes=["gpu-a"])
    assert rc == 2 and "needs >= 2 nodes" in out and not per_node
