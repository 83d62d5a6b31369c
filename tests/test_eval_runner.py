"""Stage-wise runner: resume after failures, torn lines, and a SIGKILL mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tider.eval.runner import Stage, StageRunner, read_records

REPO = Path(__file__).resolve().parents[1]


def test_failed_records_are_retried_and_torn_lines_ignored(tmp_path):
    calls = []
    flaky = {"b"}

    def fn(item):
        calls.append(item)
        if item in flaky:
            raise RuntimeError(f"transient failure on {item}")
        return {"value": item.upper()}

    runner = StageRunner(tmp_path, {"config": {"x": 1}})
    out = runner.run(Stage("s", fn), ["a", "b", "c"], key=str, progress=False)
    assert list(out) == ["a", "c"] and "RuntimeError" in runner.errors("s")["b"]
    # simulate a kill mid-write: half a JSON line without its newline
    with open(runner.stage_path("s"), "a") as f:
        f.write('{"key": "d", "stage": "s", "sta')
    flaky.clear()
    calls.clear()
    out = StageRunner(tmp_path, {"config": {"x": 1}}).run(Stage("s", fn), ["a", "b", "c", "d"], key=str, progress=False)
    assert calls == ["b", "d"]  # only the failed and the torn one are redone
    assert list(out) == ["a", "b", "c", "d"] and out["d"] == {"value": "D"}
    assert set(read_records(runner.stage_path("s"))) == {"a", "b", "c", "d"}


def test_manifest_mismatch_refuses_to_mix(tmp_path):
    # A run that wrote no record yet (it stopped on a bad option) leaves nothing to mix with.
    StageRunner(tmp_path, {"config": {"k": 20}})
    runner = StageRunner(tmp_path, {"config": {"k": 30}})
    runner.run(Stage("s", lambda item: {"v": item}), ["a"], key=str, progress=False)
    with pytest.raises(ValueError, match="different config"):
        StageRunner(tmp_path, {"config": {"k": 10}})
    StageRunner(tmp_path, {"config": {"k": 10}}, overwrite=True)


def _eval_cmd(out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tider.cli",
        "eval",
        "retrieval",
        "--dataset",
        "synthetic",
        "--windows",
        "none,timeline,oracle",
        "--k",
        "5,20",
        "--limit",
        "40",
        "--memories",
        "synth-000",
        "--out",
        str(out),
    ]


@pytest.mark.slow
def test_killed_eval_resumes_to_the_same_report(tmp_path):
    env = {
        **os.environ,
        "TIDER_CACHE": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO / "src"),
    }
    clean = tmp_path / "clean"
    subprocess.run(_eval_cmd(clean), env=env, check=True, capture_output=True, cwd=REPO)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _eval_cmd(killed),
        env={**env, "TIDER_STAGE_DELAY_S": "0.05"},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stage = killed / "retrieve-timeline.jsonl"  # second stage: kill while it is half done
    deadline = time.time() + 300
    while time.time() < deadline and not (stage.exists() and stage.read_text().count("\n") >= 10):
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "report.json").exists()
    partial = stage.read_text().count("\n")
    assert 10 <= partial < 40

    subprocess.run(_eval_cmd(killed), env=env, check=True, capture_output=True, cwd=REPO)
    for name in ("retrieve-none", "retrieve-timeline", "retrieve-oracle"):
        keys = [json.loads(line)["key"] for line in (killed / f"{name}.jsonl").read_text().splitlines() if line.strip()]
        assert len(keys) == len(set(keys)) == 40, name  # no duplicates, no gaps
    a = json.loads((clean / "report.json").read_text())
    b = json.loads((killed / "report.json").read_text())
    assert a["methods"] == b["methods"] and a["by_bucket"] == b["by_bucket"] and a["mcnemar"] == b["mcnemar"]
    # what each memory cost to build (embedding and indexes) is reported: LongMemEval builds one per question
    build = a["index_build_s"]
    assert build["memories"] >= 1 and 0 < build["p50"] <= build["max"]
    assert f"Index build per memory ({build['memories']} built in this run)" in (clean / "report.md").read_text()
