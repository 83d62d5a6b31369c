import json
import subprocess
import sys
from pathlib import Path

import pytest

from tider.cli import main

DEV = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "locomo" / "locomo_dev.json"
STATS_KEYS = {
    "conversations",
    "sessions",
    "messages",
    "queries",
    "by_category",
    "by_window_bucket",
    "unresolved_evidence",
}


def test_synth_then_stats_json(tmp_path, capsys):
    out = tmp_path / "synth"
    assert main(["data", "synth", "--out", str(out), "--messages", "900", "--conversations", "3", "--seed", "4"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["dataset.json", "messages.jsonl", "queries.jsonl"]
    capsys.readouterr()
    assert main(["data", "stats", "--dataset", "synthetic", "--path", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert STATS_KEYS <= set(stats)
    assert stats["conversations"] == 3 and stats["messages"] == 900 and stats["unresolved_evidence"] == 0
    assert sum(stats["by_category"].values()) == stats["queries"] == sum(stats["by_window_bucket"].values())


def test_stats_table_for_the_embedded_default(capsys):
    assert main(["data", "stats", "--dataset", "synthetic"]) == 0
    table = capsys.readouterr().out
    assert "conversations" in table and "category relative" in table and "gold windows >=3" in table


def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path):
    bad = tmp_path / "locomo.json"
    bad.write_text('[{"qa": [], "conversation": {"session_1": [')
    result = subprocess.run(
        [sys.executable, "-m", "tider.cli", "data", "stats", "--dataset", "locomo", "--path", str(bad)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert f"{bad}: line 1 column" in result.stderr and "invalid JSON" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(not DEV.exists(), reason="LoCoMo dev copy (../shared) not present")
def test_locomo_dev_stats_json(capsys):
    assert main(["data", "stats", "--dataset", "locomo", "--path", str(DEV), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["conversations"] == 7 and stats["queries"] == 1347
    assert stats["by_category"] == {"1": 192, "2": 214, "3": 66, "4": 563, "5": 312}
    assert stats["unresolved_evidence"] == 3
