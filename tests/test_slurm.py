"""scripts/slurm/train.slurm, unchanged, in its three documented forms, through a SLURM shim
(tests/slurm_shim: `sbatch`, `srun`, `scontrol` that run each node's step as local
processes; the "nodes" are loopback addresses of this machine). At test size on CPU: the
tiny Qwen3 stands in for Qwen3-1.7B, a "GPU" is a CPU process (GPUS_PER_NODE), and the
accelerate config is the recipes' own `zero2`: DeepSpeed picks its CPU accelerator and gloo
(the ranks log DistributedType.DEEPSPEED). The recipe overrides are trainer arguments after
the accelerate config, as a user passes them.

- 1 node SFT (configs/sft/qwen3-1.7b.yaml): its log opens, a step runs, eval and save fire.
- 1 node GRPO, vLLM colocated (configs/grpo/qwen3-1.7b.yaml): train.slurm serves the reader
  (a real vLLM server) on a "GPU" it keeps back; the trainer probes it, `answer_correct` is
  scored from it; the checkpoint is exported and served by vLLM.
- 3 nodes GRPO, vLLM server (configs/grpo/qwen3-1.7b-multinode.yaml): the policy server and
  the reader on the last node, two trainer ranks on the others, data prepared once (rank 0).
  Weight sync is where CPU stops: TRL pushes weights through vLLM's NCCL engine, which
  needs CUDA, and the trainers must fail with that reason after connecting: each has had a
  completion generated through the policy server (TRL's client) and rank 0 a reader answer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from recipetesting import COMMON, ROOT, data_args, history, steps

pytestmark = [pytest.mark.recipe, pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1800)]
SHIM = Path(__file__).resolve().parent / "slurm_shim"
READER = ROOT / "models" / "tiny-reader"  # a reader whose answers depend on its messages

# Completions the rewards can read from a model trained for a step: vLLM's structured output
# (TRL's `vllm_structured_outputs_regex`, not set by the recipe) holds generation to the
# locator's JSON with plausible dates, so the retrieval rewards and the reader really run.
LOCATOR_JSON = (
    r'\{"temporal": (false, "windows": \[\]|true, "windows": \[\{"start": "2023-0[1-9]-(0[1-9]|1[0-9]|2[0-8])", '
    r'"end": "2023-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"\}\])\}'
)


def sbatch(nodes: int, *args: str, work: Path, env: dict | None = None) -> tuple[int, str, Path]:
    """Submit through the shim from the repository root (where users submit); returns
    (status, the job's log text, its server-log folder), both moved from the root to ``work``."""
    import shutil

    from tider.llm.vllm_server import free_port

    full_env = {
        **os.environ,
        "PATH": f"{SHIM}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "MASTER_PORT": str(free_port()),
        "VLLM_PORT": str(free_port()),
        "READER_PORT": str(free_port()),
        "TIDER_WATCH_INTERVAL": "1",  # node.sh polls its servers each second: a job ends up to 4 s sooner
        **(env or {}),
    }
    run = subprocess.run(
        ["sbatch", f"--nodes={nodes}", "scripts/slurm/train.slurm", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    match = re.search(r"Submitted batch job (\d+) \(log (\S+)\)", run.stdout)
    assert match, f"no job was submitted:\n{run.stdout}\n{run.stderr}"
    log = Path(shutil.move(ROOT / match.group(2), work / match.group(2)))
    server_logs = ROOT / f"tider-locator-{match.group(1)}"
    if server_logs.exists():
        server_logs = Path(shutil.move(server_logs, work / server_logs.name))
    return run.returncode, log.read_text(errors="replace"), server_logs


@pytest.fixture(scope="module")
def production_sft(tiny_sft, recipe_work, recipe_data):
    """Form 1: `sbatch --nodes=1 train.slurm sft configs/sft/qwen3-1.7b.yaml ACCEL`, one step."""
    out = recipe_work / "qwen3-sft"
    status, log, _ = sbatch(
        1,
        "sft",
        "configs/sft/qwen3-1.7b.yaml",
        "zero2",  # the recipes' DeepSpeed config: DeepSpeed's CPU accelerator runs it (gloo)
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
        work=recipe_work,
        env={"GPUS_PER_NODE": "1"},
    )
    assert status == 0, log[-6000:]
    return out, log


def test_sft_one_node(production_sft):
    out, log = production_sft
    assert "sft: trainers on 127.0.0.1 (1 GPUs each)" in log
    assert "sft: process 0 of 1 (DistributedType.DEEPSPEED)" in (out / "logs" / "rank0.log").read_text()
    settings = json.loads((out / "tider_locator.json").read_text())["prompt_settings"]
    assert settings["lines"]["max_lines"] == 30 and settings["max_prompt_tokens"] == 3584  # the recipe's
    assert steps(out) == [1]
    # the recipe's eval and save intervals are shares of the run: they fire even in a 1-step run
    assert any("eval_loss" in h for h in history(out)), history(out)
    assert (out / "checkpoint-1" / "trainer_state.json").exists()


def grpo_job(recipe: str, start: Path, out: Path, recipe_data: Path, accel: str = "zero2") -> list[str]:
    """train.slurm's arguments for one GRPO step of ``recipe`` from ``start`` at test size,
    under the accelerate config ``accel`` (the recipes' ``zero2`` unless said)."""
    overrides = ["--model_name_or_path", str(start), "--output_dir", str(out), "--max_steps", "1", "--use_cpu", "true"]
    return ["grpo", recipe, accel, *overrides, *data_args(recipe_data), *COMMON]


def test_grpo_one_node_colocate_with_the_launchers_reader(production_sft, recipe_work, recipe_data):
    """The reader is models/tiny-reader (scripts/train_tiny_reader.py), which answers from its
    messages: right more often with the evidence than without, so its scores move with
    what each completion's windows retrieved."""
    out = recipe_work / "qwen3-grpo"
    status, log, server_logs = sbatch(
        1,
        *grpo_job("configs/grpo/qwen3-1.7b.yaml", production_sft[0], out, recipe_data),
        "--vllm_structured_outputs_regex",
        LOCATOR_JSON,
        work=recipe_work,
        env={"GPUS_PER_NODE": "2", "READER_MODEL": str(READER), "READER_MAX_LEN": "4096"},
    )
    assert status == 0, log[-6000:]
    assert "grpo: trainers on 127.0.0.1 (1 GPUs each)" in log  # one of the node's 2 kept for the reader
    rank0 = (out / "logs" / "rank0.log").read_text()
    assert "answered a probe" in rank0 and "grpo: process 0 of 1 (DistributedType.DEEPSPEED)" in rank0
    [logged] = [h for h in history(out) if "loss" in h]
    assert "sampling/sampling_logp_difference/mean" in logged, sorted(logged)  # vLLM generated in the trainer
    assert logged["reader/calls"] > 0 and logged["reader/failures"] == 0, logged
    reader_log = (server_logs / "reader.log").read_text(errors="replace")
    assert reader_log.count("POST /v1/chat/completions") >= logged["reader/calls"]
    # The reader's scores vary: of the step's 4 questions x 8 completions, some retrieved
    # contexts got an answer that scores (F1 > 0) and some did not. A reader that is never
    # asked, a context that lost its messages or a gold that is not the question's would leave
    # every answer at 0; test_answer_scorer pins that the score is the evaluation's F1.
    assert 0 < logged["reader/f1_above_0"] < logged["reader/calls"], logged
    assert 0 < logged["rewards/answer_correct/mean"] < 1 and logged["rewards/answer_correct/std"] > 0, logged
    export = recipe_work / "qwen3-grpo-export"
    tider_cli("export", "--checkpoint", str(out), "--out", str(export), "--dtype", "float32")
    assert_serve_check_request(export, recipe_work / "qwen3-grpo-served.log")


def assert_serve_check_request(export: Path, log: Path) -> None:
    """`tider serve --model EXPORT --check-request`, the README's post-step, in its own
    process: it checks the export, starts vLLM, sends one real locator prompt (cue, timeline
    lines) with the prompt's schema, prints the raw answer and its parse (or a typed failure,
    never an exception), stops the server and exits 0."""
    import socket

    from tider.llm.vllm_server import free_port
    from tider.locator.parse import ParseFailure

    port = free_port()
    args = ("--port", str(port), "--log", str(log), "--check-request", "--enforce-eager", "--dtype", "float32")
    served, _, printed = tider_cli("serve", "--model", str(export), *args).stdout.partition("\n")
    assert served.startswith(f"serving {export}") and f":{port}" in served
    out = json.loads(printed)
    assert out["raw"].strip()
    assert (out["failure"] is None) == (out["prediction"] is not None)
    assert out["failure"] in (None, *(f.value for f in ParseFailure))
    assert "POST /v1/chat/completions" in log.read_text(errors="replace")  # it went through the server
    with pytest.raises(OSError):  # and the server is gone
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_server_that_dies_ends_the_job_naming_it(production_sft, recipe_work, recipe_data):
    """Issue 43 item 5: a reader that cannot start (here a folder with a config and no weights,
    which passes the preflight's staging check) ends the job with the reader's name and log,
    instead of the trainer waiting out its reader_wait_timeout (20 minutes here) for a server
    that is gone."""
    broken = recipe_work / "reader-without-weights"
    broken.mkdir(exist_ok=True)
    (broken / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}))
    out = recipe_work / "qwen3-grpo-dead-reader"
    status, log, server_logs = sbatch(
        1,
        *grpo_job("configs/grpo/qwen3-1.7b.yaml", production_sft[0], out, recipe_data),
        "--reader_wait_timeout",
        "1200",
        work=recipe_work,
        env={"GPUS_PER_NODE": "2", "READER_MODEL": str(broken)},
    )
    assert status != 0
    assert "the reader server on 127.0.0.1 exited" in log and "reader.log" in log, log[-4000:]
    assert "ReaderUnavailable" not in log  # the trainer was stopped, not timed out
    assert (server_logs / "reader.log").read_text(errors="replace").strip()  # vLLM's own reason is there
    assert not (out / "model.safetensors").exists()


def test_an_unstaged_model_stops_the_job_before_any_server_starts(recipe_work, recipe_data, tmp_path):
    """Issue 43 items 1-2: train.slurm runs the preflight first; the recipe's reader
    (Qwen/Qwen3-8B), not in this HF_HOME, is a refusal naming it and `tider stage`, in
    seconds, not a reader that dies offline and trainers that wait for it."""
    start = ROOT / "models" / "tiny-locator-v3"
    status, log, server_logs = sbatch(
        1,
        *grpo_job("configs/grpo/qwen3-1.7b.yaml", start, tmp_path / "out", recipe_data),
        work=recipe_work,
        env={"GPUS_PER_NODE": "2", "HF_HOME": str(tmp_path / "hf")},
    )
    assert status == 2, log[-3000:]
    assert "refused: the reader Qwen/Qwen3-8B is not staged" in log
    assert "tider stage configs/grpo/qwen3-1.7b.yaml" in log
    assert not server_logs.exists() or not (server_logs / "reader.log").exists()


def test_grpo_three_nodes_server_mode(production_sft, recipe_work, recipe_data, tiny_qwen3_dir):
    out = recipe_work / "qwen3-grpo-multinode"
    status, log, server_logs = sbatch(
        3,
        *grpo_job("configs/grpo/qwen3-1.7b-multinode.yaml", production_sft[0], out, recipe_data),
        "--vllm_server_timeout",
        "600",
        work=recipe_work,
        env={
            "GPUS_PER_NODE": "2",
            "READER_MODEL": str(tiny_qwen3_dir),
            "READER_MAX_LEN": "4096",
            "TIDER_CACHE": str(recipe_work / "cache-multinode"),  # empty: rank 0 has to fill it
        },
    )
    assert "trainers on 127.0.0.1 127.0.0.2 (2 GPUs each), vLLM server on 127.0.0.3" in log
    vllm_log = (server_logs / "vllm.log").read_text(errors="replace")
    # the server started with TRL's flags (test_slurm_dry_run checks them: data parallel 1) and
    # TRL's client found it (vLLM logs no flag left at its default, so the flags are not read here)
    assert "GET /health" in vllm_log
    ranks = {r: (out / "logs" / f"rank{r}.log").read_text() for r in range(4)}
    assert "answered a probe" in ranks[0]
    resolved = [
        int(re.search(r"data on rank \d+: (\d+) time expressions resolved here", t).group(1)) for t in ranks.values()
    ]
    assert resolved[0] > 0 and resolved[1:] == [0, 0, 0], resolved  # rank 0 prepared, the others read its cache
    assert status != 0 and "weight sync" in log and "CUDA" in log, log[-6000:]
    # the exact call that failed is the weight-sync channel's setup, nothing before it
    assert "the call that failed: vllm_client.py:init_communicator" in log, log[-6000:]
    assert "connected to the vLLM server" in log
    # before it: generation through the policy server (TRL's client, every rank) and the
    # reader's probe answer (rank 0 scores rewards with it)
    probe = re.compile(r"the vLLM server generated a probe: [1-9]\d* tokens")
    assert all(probe.search(t) for t in ranks.values()), ranks[0][-3000:]


def tider_cli(*args: str) -> subprocess.CompletedProcess:
    run = subprocess.run(
        [sys.executable, "-m", "tider.cli", *args],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, f"tider {args[0]} failed:\n{run.stdout[-3000:]}\n{run.stderr[-4000:]}"
    return run


def test_the_time_limit_signal_saves_requeues_and_resumes(tiny_sft, recipe_work, recipe_data):
    """SLURM's signal before the time limit (`#SBATCH --signal=B:USR1@600`; the shim sends it
    once the trainer has logged a step): the trainer saves a checkpoint and stops, train.slurm
    requeues the job (`scontrol requeue`), and the requeued job resumes from that checkpoint
    (resume is train.slurm's default) and trains to the end, no step run twice."""
    out = recipe_work / "qwen3-sft-requeued"
    status, log, _ = sbatch(
        1,
        "sft",
        "configs/sft/qwen3-1.7b.yaml",
        "ddp",
        *("--model_name_or_path", str(recipe_work / "base"), "--output_dir", str(out)),
        *("--max_steps", "8", "--use_cpu", "true"),  # stopped at step 3 here: 5 steps of margin
        # The signal, the save and the requeue are under test, not the recipe's batch: one
        # micro-batch a step and no evaluation make each step ~1 s instead of ~4 s.
        *("--gradient_accumulation_steps", "1", "--eval_strategy", "no"),
        *data_args(recipe_data),
        *COMMON,
        work=recipe_work,
        env={"GPUS_PER_NODE": "1", "SHIM_SIGNAL_WHEN": str(out / "metrics.jsonl")},
    )
    assert status == 0, log[-6000:]
    assert "the time limit is near" in log and "requeueing job" in log, log[-6000:]
    assert "requeued; running it again" in log
    stopped = re.search(r"saving a checkpoint at step (\d+) and stopping", log)
    assert stopped and int(stopped.group(1)) < 8, log[-6000:]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # each step once: the requeued job resumed from the checkpoint, it did not start again
    assert [r["step"] for r in logged if "loss" in r] == list(range(1, 9)), logged
    assert steps(out) == list(range(1, 9))
