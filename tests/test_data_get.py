"""`tider data get`: public benchmarks one command away, checksummed, laid out as the loaders
read them. No test touches the network: the sources are read from a local mirror (file://,
`--mirror` / $TIDER_DATA_MIRROR), laid out as the public files are named."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tider.data.sources import SOURCES, DownloadError, get

ROOT = Path(__file__).resolve().parents[1]
SHARED_REALMEM = ROOT.parent / "shared" / "data" / "realmem"


@pytest.fixture
def mirror(tmp_path, real_like):
    """LoCoMo from the tests' LoCoMo-format file (no pinned checksum: recorded on first use)."""
    base = tmp_path / "mirror"
    (base / "locomo").mkdir(parents=True)
    shutil.copy(real_like[0], base / "locomo" / "locomo10.json")
    return base


def test_the_readme_data_command_runs_as_written(mirror, tmp_path):
    text = (ROOT / "README.md").read_text()
    command = re.search(r"<!-- data-get -->\n```bash\n(.+?)\s+#", text).group(1)
    assert command == "tider data get locomo --out data"
    env = {**os.environ, "TIDER_DATA_MIRROR": mirror.as_uri()}  # the only change: no network here
    cli = [sys.executable, "-m", "tider.cli", *command.split()[1:]]
    done = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "CC BY-NC 4.0" in done.stdout
    folder = tmp_path / "data" / "locomo"
    assert json.loads((folder / "locomo10.json").read_text()) == json.loads(
        (mirror / "locomo" / "locomo10.json").read_text()
    )
    assert "snap-research/locomo" in (folder / "SOURCE.md").read_text()
    stats = subprocess.run(
        [
            sys.executable,
            "-m",
            "tider.cli",
            "data",
            "stats",
            "--dataset",
            "locomo",
            "--path",
            str(folder / "locomo10.json"),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert stats.returncode == 0 and json.loads(stats.stdout)["conversations"] >= 1, stats.stderr


def test_a_recorded_checksum_catches_a_changed_file_and_writes_nothing(mirror, tmp_path):
    out = tmp_path / "data"
    get("locomo", out, mirror.as_uri(), log=lambda *_: None)
    before = (out / "locomo" / "locomo10.json").read_bytes()
    get("locomo", out, mirror.as_uri(), log=lambda *_: None)  # present and matching: kept
    (mirror / "locomo" / "locomo10.json").write_text("[]")  # upstream changed
    (out / "locomo" / "locomo10.json").unlink()
    with pytest.raises(DownloadError, match="sha256"):
        get("locomo", out, mirror.as_uri(), log=lambda *_: None)
    assert not (out / "locomo" / "locomo10.json").exists() and not list((out / "locomo").glob(".*part"))
    assert before  # the first download had written the file


def test_missing_and_unknown_sources_are_clear_errors(tmp_path):
    with pytest.raises(DownloadError, match="unknown dataset"):
        get("nosuch", tmp_path)
    with pytest.raises(DownloadError, match="longmemeval_s.json"):
        get("longmemeval", tmp_path, (tmp_path / "empty").as_uri(), log=lambda *_: None)


@pytest.mark.skipif(not SHARED_REALMEM.is_dir(), reason="the RealMem development copy is not beside the repository")
def test_realmem_matches_the_pinned_checksums(tmp_path):
    base = tmp_path / "mirror" / "realmem"
    base.mkdir(parents=True)
    for f in SOURCES["realmem"].files:
        (base / f.name).symlink_to(SHARED_REALMEM / f.name)
    folder = get("realmem", tmp_path / "data", (tmp_path / "mirror").as_uri(), log=lambda *_: None)
    assert sorted(p.name for p in folder.glob("*.json")) == sorted(f.name for f in SOURCES["realmem"].files)
    from tider.data import load_dataset

    assert len(load_dataset("realmem", str(folder)).memories) == 7
