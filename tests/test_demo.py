"""`tider demo`'s choices. The demo end to end, then its resume, runs from the built wheel in
a clean venv (tests/test_wheel.py); serving is tests/test_serve_vllm.py's."""

from __future__ import annotations

import pytest


def test_unknown_recipe_lists_the_known_ones(tmp_path):
    from tider.cli import main

    with pytest.raises(SystemExit, match="known recipes: .*tiny-cpu"):
        main(["demo", "--recipe", "nope", "--out", str(tmp_path)])


def test_sft_starts_from_the_shipped_model_unless_told(tmp_path):
    """The demo fine-tunes the recipe's pretrained start (models/tiny-locator-v3) by default,
    by absolute path so it runs from any directory; --from-scratch builds one under --out;
    a Hub-id recipe keeps its own model_name_or_path."""
    import yaml

    from tider import resources
    from tider.commands.demo import _sft_start

    tiny = yaml.safe_load(resources.path("configs/sft/tiny-cpu.yaml").read_text())
    assert _sft_start(tiny, tmp_path, False) == str(resources.path("models/tiny-locator-v3"))
    assert (resources.path("models/tiny-locator-v3") / "model.safetensors").exists()
    assert _sft_start(tiny, tmp_path, True) == str(tmp_path / "base")
    assert _sft_start({**tiny, "model_name_or_path": "nowhere/yet"}, tmp_path, False) == str(tmp_path / "base")
    production = yaml.safe_load(resources.path("configs/sft/qwen3-1.7b.yaml").read_text())
    assert _sft_start(production, tmp_path, False) is None


def test_the_pipeline_numbers_times_and_closes_its_stages(tmp_path, capsys):
    """tider.pipeline.run: each stage under a numbered banner, timed by name; what a stage
    enters on the run's stack (a server) lives until the last stage has run, and no longer."""
    from contextlib import contextmanager

    from tider import pipeline

    events = []

    @contextmanager
    def server():
        events.append("up")
        yield
        events.append("down")

    class Stage:
        def __init__(self, name, action):
            self.name, self.title, self.action = name, f"the {name} stage", action

        def __call__(self, run):
            self.action(run)
            events.append(self.name)

    stages = [Stage("serve", lambda run: run.stack.enter_context(server())), Stage("compare", lambda run: None)]
    run = pipeline.run(stages, tmp_path / "out")
    assert events == ["up", "serve", "compare", "down"]
    assert set(run.times) == {"serve", "compare"} and (tmp_path / "out").is_dir()
    printed = capsys.readouterr().out
    assert "=== [1/2] the serve stage" in printed and "=== [2/2] the compare stage" in printed


def test_a_training_stage_is_its_recipe_and_overrides(tmp_path):
    """Train names its folder, title and argv from the data it is given; a trained folder is skipped."""
    from tider import resources
    from tider.pipeline import Run, Train

    recipe = resources.path("configs/sft/tiny-cpu.yaml")
    train = Train("sft", recipe, tmp_path / "sft", "start", ["--max_steps", "3"])
    assert train.name == "sft" and train.title == "SFT (configs/sft/tiny-cpu.yaml)"
    assert train.argv() == [
        "--config",
        str(recipe),
        "--output_dir",
        str(tmp_path / "sft"),
        "--model_name_or_path",
        "start",
        "--max_steps",
        "3",
    ]
    assert train.parse()[1].max_steps == 3
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "tider_locator.json").write_text("{}")
    (tmp_path / "sft" / "model.safetensors").write_text("")
    run = Run(tmp_path)
    train(run)
    assert run.skipped == {"sft"} and run.model == tmp_path / "sft"
