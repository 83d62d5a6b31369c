"""scripts/slurm/train.slurm in dry-run mode: what each node of a simulated allocation
runs (scripts/slurm/node.sh prints its commands). Server mode: the last node serves the
policy with TRL's flags (`tider serve --for-trl`, one replica) and the reader, the others
train with one machine rank each and find both by flags; colocate: every node trains and
the first also serves the reader on a GPU each node keeps back. tests/test_slurm.py runs the
same forms for real through a SLURM shim."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from test_launch import stage_fake

ROOT = Path(__file__).resolve().parents[1]
NODES = ["gpu-a", "gpu-b", "gpu-c"]
SFT_OUTPUT = ROOT / "runs" / "qwen3-1.7b" / "sft"  # where the GRPO recipes start: the SFT job's output


@pytest.fixture(scope="module")
def staged_home(tmp_path_factory):
    """The recipes' Hub models staged (train.slurm's preflight refuses a job without them),
    and the SFT job's output in place for the GRPO forms; removed after if made here."""
    home = tmp_path_factory.mktemp("hf")
    stage_fake(home, "Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B")
    made = not SFT_OUTPUT.exists()
    SFT_OUTPUT.mkdir(parents=True, exist_ok=True)
    yield home
    if made:
        import shutil

        shutil.rmtree(SFT_OUTPUT)


@pytest.fixture(autouse=True)
def _staged(staged_home, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(staged_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def dry_run(*args: str, nodes=NODES, env=None) -> tuple[int, dict[str, list[str]], str]:
    env = {**os.environ, "TIDER_DRY_RUN": "1", "TIDER_DRY_RUN_NODES": " ".join(nodes), **(env or {})}
    run = subprocess.run(
        ["bash", "scripts/slurm/train.slurm", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    per_node: dict[str, list[str]] = {}  # the commands; each node's "network:" line is asserted apart
    for line in run.stdout.splitlines():
        m = re.match(r"\[(\S+)\] (.*)", line)
        if m and not m.group(2).startswith("network: "):
            per_node.setdefault(m.group(1), []).append(m.group(2))
    return run.returncode, per_node, run.stdout + run.stderr


def flag(command: str, name: str) -> str:
    return re.search(rf"{name} (\S+)", command).group(1)


def test_server_mode_last_node_serves_the_others_train():
    recipe = "configs/grpo/qwen3-1.7b-multinode.yaml"
    rc, per_node, out = dry_run("grpo", recipe, "zero2", "--max_steps", "5", env={"VLLM_TP": "2"})
    assert rc == 0, out
    assert set(per_node) == set(NODES) and len(per_node["gpu-a"]) == len(per_node["gpu-b"]) == 1
    server, reader = per_node["gpu-c"]
    model = yaml.safe_load((ROOT / recipe).read_text())["model_name_or_path"]
    assert "tider serve --for-trl" in server and flag(server, "--model") == model
    assert flag(server, "--host") == "0.0.0.0" and flag(server, "--port") == "8000"
    assert flag(server, "--tensor-parallel-size") == "2" and server.startswith("CUDA_VISIBLE_DEVICES=0,1 ")
    # the recipe's length, as the colocated engine gets it (issue 43 item 6), not tider serve's 4096
    assert flag(server, "--max-model-len") == str(yaml.safe_load((ROOT / recipe).read_text())["vllm_max_model_length"])
    assert "trl vllm-serve" not in out and "data_parallel" not in out  # deprecated; DP errors for dense models
    assert "tider serve --skip-check" in reader and reader.startswith("CUDA_VISIBLE_DEVICES=7 ")
    assert flag(reader, "--port") == "8001" and flag(reader, "--model") == "Qwen/Qwen3-8B"
    for rank, node in enumerate(["gpu-a", "gpu-b"]):
        [train] = per_node[node]
        assert "accelerate launch" in train and f"-m tider.cli grpo --config {recipe}" in train
        assert flag(train, "--machine_rank") == str(rank) and flag(train, "--num_machines") == "2"
        assert flag(train, "--num_processes") == "16" and flag(train, "--main_process_ip") == "gpu-a"
        assert flag(train, "--vllm_server_host") == "gpu-c" and flag(train, "--vllm_server_port") == "8000"
        assert flag(train, "--reader_base_url") == "http://gpu-c:8001/v1"
        assert "--max_steps 5" in train  # extra arguments reach the trainer


def test_colocate_keeps_a_gpu_back_for_the_reader_and_sft_trains_on_all():
    rc, per_node, out = dry_run("grpo", "configs/grpo/qwen3-1.7b.yaml", "zero3")
    assert rc == 0, out
    reader, first = per_node["gpu-a"]
    assert reader.startswith("CUDA_VISIBLE_DEVICES=7 ") and "tider serve --skip-check" in reader
    assert first.startswith("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6 ")
    assert all(len(per_node[n]) == 1 for n in NODES[1:])  # one reader for the job
    trains = [per_node[n][-1] for n in NODES]
    assert sorted(flag(t, "--machine_rank") for t in trains) == ["0", "1", "2"]
    assert all(
        flag(t, "--num_processes") == "21" and flag(t, "--config_file") == "configs/accelerate/zero3.yaml"
        for t in trains
    )
    assert all(flag(t, "--reader_base_url") == "http://gpu-a:8001/v1" for t in trains)
    rc, per_node, out = dry_run("sft", "configs/sft/qwen3-1.7b.yaml", "zero3")
    assert rc == 0 and "tider serve" not in out and "reader" not in out, out
    assert all(flag(per_node[n][0], "--num_processes") == "24" for n in NODES)


def test_an_external_reader_is_named_not_started():
    rc, per_node, out = dry_run(
        "grpo", "configs/grpo/qwen3-1.7b.yaml", "zero2", env={"READER_URL": "http://reader.internal:9000/v1"}
    )
    assert rc == 0 and "tider serve" not in out, out
    assert all(flag(per_node[n][0], "--reader_base_url") == "http://reader.internal:9000/v1" for n in NODES)
    assert flag(per_node["gpu-a"][0], "--num_processes") == "24"  # no GPU kept back


def test_server_mode_on_one_node_is_refused():
    rc, per_node, out = dry_run("grpo", "configs/grpo/qwen3-1.7b-multinode.yaml", "zero2", nodes=["gpu-a"])
    assert rc == 2 and "needs >= 2 nodes" in out and not per_node


def test_the_log_is_not_in_a_folder_the_job_would_create():
    """SLURM opens --output/--error before the script runs: a folder in them must already
    exist, and only the submission directory is sure to."""
    directives = re.findall(
        r"^#SBATCH --(output|error)=(.*)$", (ROOT / "scripts/slurm/train.slurm").read_text(), re.MULTILINE
    )
    assert directives and all("/" not in path for _, path in directives), directives


def node_network(**env: str) -> str:
    """The "network:" line node.sh prints in a dry run: the variables as its children see them."""
    roles = {"TIDER_ROLES": "vllm", "TIDER_VLLM_TP": "1", "TIDER_VLLM_MODEL": "m", "TIDER_VLLM_PORT": "8000"}
    run = subprocess.run(
        ["bash", "scripts/slurm/node.sh", "grpo", "configs/grpo/qwen3-1.7b-multinode.yaml", "zero2"],
        cwd=ROOT,
        env={**os.environ, "TIDER_DRY_RUN": "1", "TIDER_LOG_DIR": "logs", **roles, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    [line] = [x for x in run.stdout.splitlines() if x.startswith("network: ")]
    return line


def test_each_node_exports_its_address_as_slurm_names_it(monkeypatch):
    """Issue 43 item 6: vLLM binds to VLLM_HOST_IP, resolved from SLURMD_NODENAME (srun sets
    it on each node); a value set in the submitting shell wins, as do the NCCL/gloo interfaces."""
    for name in ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    resolved = node_network(SLURMD_NODENAME="localhost")
    assert "VLLM_HOST_IP=127.0.0.1 NCCL_SOCKET_IFNAME=unset" in resolved, resolved
    chosen = node_network(SLURMD_NODENAME="localhost", VLLM_HOST_IP="10.1.2.3", NCCL_SOCKET_IFNAME="ib0")
    assert "VLLM_HOST_IP=10.1.2.3 NCCL_SOCKET_IFNAME=ib0" in chosen, chosen
    unknown = node_network(SLURMD_NODENAME="no-such-node.invalid")
    assert "VLLM_HOST_IP=unset (the node name did not resolve)" in unknown, unknown
    # train.slurm's plan shows each node's line under that node's name
    rc, _, out = dry_run("grpo", "configs/grpo/qwen3-1.7b-multinode.yaml", "zero2")
    assert rc == 0 and all(f"[{node}] network: VLLM_HOST_IP=" in out for node in NODES), out
