"""`tider demo` end to end at toy scale (small model, few steps, locator through local
transformers instead of vLLM — tests/test_serve_vllm.py covers serving), then a rerun
that resumes: finished stages are skipped, the report is rebuilt from the same models."""

from __future__ import annotations

import json

import pytest

TOY = [
    "--synthetic-messages",
    "600",
    "--synthetic-conversations",
    "3",
    "--sft-steps",
    "20",
    "--grpo-steps",
    "1",
    "--no-serve",
    "--limit",
    "6",
    "--from-scratch",
    # to both TrlParser recipes:
    "--tiny_hidden_size",
    "64",
    "--tiny_num_layers",
    "2",
    "--tiny_num_heads",
    "2",
    "--tiny_vocab_size",
    "1024",
    "--prompt_lines",
    "4",
    "--max_prompt_tokens",
    "256",
    "--report_to",
    "none",
    "--save_strategy",
    "no",
]


@pytest.mark.slow
def test_demo_runs_every_stage_then_resumes(tmp_path, capsys):
    from tider.cli import main

    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), *TOY]) == 0
    printed = capsys.readouterr().out
    for step in range(1, 9):
        assert f"[{step}/8]" in printed
    export = json.loads((out / "export" / "export_report.json").read_text())
    assert export["greedy_identical"] and export["dtype"] == "float32"
    assert json.loads((out / "export" / "tider_locator.json").read_text())["prompt_settings"]["lines"]["max_lines"] == 4
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
    assert comparison["n_queries"] == 6
    assert (out / "compare" / "compare.png").exists()
    # SFT and SFT+GRPO on the same questions, the paired difference and its interval, printed
    paired = json.loads((out / "compare" / "grpo_vs_sft.json").read_text())
    sft = json.loads((out / "compare-sft" / "compare.json").read_text())
    assert sft["methods"] == ["locator"] and sft["n_queries"] == paired["n"] <= 6 and paired["n"] > 0
    d = paired["after_minus_before"]
    assert d["ci_low"] <= d["mean"] <= d["ci_high"] and d["n"] == paired["n"]
    assert paired["recall@20"]["after"] - paired["recall@20"]["before"] == pytest.approx(d["mean"])
    assert "SFT vs SFT+GRPO" in printed and "95% paired bootstrap" in printed
    first = json.loads((out / "timings.json").read_text())

    assert main(["demo", "--out", str(out), *TOY]) == 0  # resume: nothing retrained
    again = json.loads((out / "timings.json").read_text())
    assert again["sft"] < 1.0 and again["grpo"] < 1.0 and first["sft"] > again["sft"]
    assert json.loads((out / "compare" / "compare.json").read_text())["table"] == comparison["table"]


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
