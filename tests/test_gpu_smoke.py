"""scripts/gpu_smoke.sh, the rehearsal of the production path, in its CPU form
(TIDER_SMOKE_ALLOW_CPU=1): the production recipes at test size, a real vLLM reader that
GRPO's answer_correct asks, TRL's colocated vLLM, the export, vLLM serving it and one
comparison against the served export. The GPU form runs the same steps at Qwen3-1.7B shapes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANSWERED = '"POST /v1/chat/completions HTTP/1.1" 200'  # vLLM's access log
STEPS = ["preflight", "data", "embedder", "base", "sft", "reader", "grpo", "export", "serve", "compare"]


def _table(stdout: str) -> dict[str, tuple[str, str]]:
    """step -> (status, figure) from the summary table the script prints last."""
    rows = re.findall(r"^\| ([\w-]+) \| (ok|FAILED|skipped) \| (\d+) \| (.*) \|$", stdout, flags=re.MULTILINE)
    return {step: (status, figure) for step, status, _, figure in rows}


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_cpu_smoke_runs_every_step(tmp_path):
    from tider.llm.vllm_server import vllm_available
    from tider.retrieval.embed import embedding_model_id

    if not vllm_available():
        pytest.skip("vLLM is not installed (scripts/setup.sh installs it)")
    env = {**os.environ, "TIDER_SMOKE_ALLOW_CPU": "1"}
    # Its own process group: on a timeout SIGTERM reaches the script, which stops its servers.
    run = subprocess.Popen(
        ["bash", "scripts/gpu_smoke.sh", str(tmp_path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, _ = run.communicate(timeout=1100)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGTERM)
        stdout, _ = run.communicate(timeout=120)
        pytest.fail(f"gpu_smoke.sh did not finish in 1100 s:\n{stdout[-6000:]}")
    assert run.returncode == 0, stdout[-8000:]
    table = _table(stdout)
    assert list(table) == STEPS, stdout[-3000:]
    assert all(status == "ok" for status, _ in table.values()), table
    assert (tmp_path / "summary.md").read_text().count("| ok |") == len(STEPS)
    assert re.search(r"loss \d+\.\d+ -> \d+\.\d+ \(2 steps\)", table["sft"][1]), table["sft"]
    # GRPO's answer_correct asked the served reader, and no call failed
    calls = re.search(r"\((\d+) reader calls, (\d+) failed\)", table["grpo"][1])
    assert calls and int(calls[1]) > 0 and calls[2] == "0", table["grpo"]
    assert ANSWERED in (tmp_path / "reader-vllm.log").read_text(errors="replace")
    assert table["export"][1].startswith("greedy identical True"), table["export"]
    # training searched with the embedder the smoke built (retrieval_config), as a GPU box must
    meta = json.loads((tmp_path / "export" / "tider_locator.json").read_text())
    assert meta["embedding_model"] == embedding_model_id(str(tmp_path / "embedder")), meta["embedding_model"]
    # the comparison's locator rows came from the served export, which answered every request
    assert re.search(r"recall@5/@20 none [\d.]+/[\d.]+, rules .*, locator [\d.]+/[\d.]+", table["compare"][1])
    served = (tmp_path / "serve-vllm.log").read_text(errors="replace")
    assert ANSWERED in served and '/v1/chat/completions HTTP/1.1" 5' not in served
    for step in STEPS:
        assert (tmp_path / f"{step}.log").exists(), step


def test_without_vllm_the_smoke_fails_at_its_preflight_naming_it(tmp_path):
    """A GPU box without vLLM cannot rehearse the reader, GRPO's rollouts or serving: the
    smoke stops at its preflight with a non-zero status, before any training, and says why."""
    hidden = tmp_path / "hide"
    (hidden / "vllm").mkdir(parents=True)
    (hidden / "vllm" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = {**os.environ, "TIDER_SMOKE_ALLOW_CPU": "1", "PYTHONPATH": str(hidden)}
    run = subprocess.run(
        ["bash", "scripts/gpu_smoke.sh", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout[-3000:]
    table = _table(run.stdout)
    assert list(table) == ["preflight"], run.stdout[-3000:]
    assert table["preflight"][0] == "FAILED"
    assert "not importable: vllm" in (tmp_path / "out" / "preflight.log").read_text()
    assert not (tmp_path / "out" / "data").exists()  # nothing ran after it
