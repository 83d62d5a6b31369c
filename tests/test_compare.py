"""tider eval compare: the comparison arithmetic on hand-made records, and a real run through
the CLI (synthetic slice, local tiny locator, every learning-free baseline, oracle) that
resumes without redoing or duplicating records."""

from __future__ import annotations

import json

import pytest

from tider.eval.compare import CompareConfig, build_comparison, markdown, oracle_gap
from tider.eval.metrics import query_metrics
from tider.eval.report import build_report


def _record(ids, gold, ks, iou=0.0, switch=1.0):
    r = {
        "category": "c",
        "bucket": "1",
        "gold_temporal": True,
        "pred_temporal": True,
        "n_windows": 1,
        "iou": iou,
        "switch": switch,
    }
    r.update(query_metrics(ids, gold, ks))
    return r


def test_oracle_gap_and_mcnemar_orientation():
    ks = [1, 2]
    gold = {f"q{i}": [i] for i in range(6)}
    # none finds 1 of 6 at k=1; locator finds 4 (incl. none's); oracle finds all 6.
    found = {"none": {0}, "locator": {0, 1, 2, 3}, "oracle": set(range(6))}
    records = {
        m: {q: _record([g[0]] if int(q[1:]) in hit else [99], g, ks) for q, g in gold.items()}
        for m, hit in found.items()
    }
    report = build_report(records, ks, mcnemar_k=1)
    comparison = build_comparison(report, CompareConfig(baselines=["none"], source_options={"locator": {"url": "x"}}))
    assert comparison["table"]["locator"]["recall@1"] == pytest.approx(4 / 6)
    gap = comparison["oracle_gap"]["recall@1"]
    assert gap["captured"] == pytest.approx((4 / 6 - 1 / 6) / (1 - 1 / 6))
    test = comparison["mcnemar"]["locator_vs"]["none"]
    assert (test["b"], test["c"]) == (3, 0)  # locator-only hits are b
    assert test["p"] == pytest.approx(0.25)  # exact two-sided binomial, 3 of 3
    md = markdown(comparison)
    assert "| recall@1 | 0.167 | 0.667 | 1.000 | 0.600 |" in md
    # QA accuracy (forest context) joins the table when a reader was configured
    qa = {"runs": {"locator/forest": {"accuracy": 0.5, "f1": 0.4}, "locator/flat": {"accuracy": 0.1, "f1": 0.1}}}
    with_qa = build_comparison(report, CompareConfig(baselines=["none"], source_options={"locator": {"url": "x"}}), qa)
    assert with_qa["table"]["locator"]["qa_accuracy"] == 0.5 and "qa_accuracy" not in with_qa["table"]["none"]
    assert "qa_accuracy" in markdown(with_qa)


def test_oracle_gap_undefined_without_gain():
    methods = {m: {"recall@5": 0.5} for m in ("none", "locator", "oracle")}
    assert oracle_gap(methods, [5])["recall@5"]["captured"] is None
    assert oracle_gap({"none": {}, "locator": {}}, [5]) == {}


def test_a_combined_dataset_gets_a_table_per_dataset(tiny_qwen3_dir, tmp_path):
    """Two datasets as one (``tider.data.combine``): the pooled comparison, and the same
    table per dataset from the same records (each dataset's rows add up to the pool)."""
    from tider.data import combine
    from tider.data.synth import generate
    from tider.eval.compare import run_compare

    a = generate(100, seed=1, n_conversations=1, key_prefix="a")
    b = generate(100, seed=2, n_conversations=1, key_prefix="b")
    a.name, b.name = "first", "second"
    both = combine([a, b])
    config = CompareConfig(
        baselines=["none", "top-day"],
        limit=None,
        source_options={"locator": {"model": str(tiny_qwen3_dir), "allow_unknown_settings": True}},
    )
    config.memory_keys = sorted(both.memories)
    comparison = run_compare(both, config, tmp_path / "cmp", progress=False)
    parts = comparison["per_dataset"]
    assert set(parts) == {"first", "second"}
    assert parts["first"]["n_queries"] + parts["second"]["n_queries"] == comparison["n_queries"]
    for m in ("none", "top-day", "oracle"):  # hit_all@20 is a mean over queries: the parts add up to the pool
        pooled = comparison["table"][m]["hit_all@20"] * comparison["n_queries"]
        assert sum(p["table"][m]["hit_all@20"] * p["n_queries"] for p in parts.values()) == pytest.approx(pooled)
    assert "## Locator vs baselines (first" in (tmp_path / "cmp" / "compare.md").read_text()


def test_compare_needs_the_locator():
    with pytest.raises(ValueError, match="needs the locator"):
        _ = CompareConfig().methods


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    from tider.data.synth import generate, write

    out = tmp_path_factory.mktemp("synth")
    write(generate(300, seed=1, n_conversations=3), str(out))
    return out


def test_compare_cli_end_to_end_and_resume(tiny_qwen3_dir, synthetic_dir, tmp_path, capsys):
    from tider.cli import main

    out = tmp_path / "cmp"
    argv = [
        "eval",
        "compare",
        "--dataset",
        "synthetic",
        "--path",
        str(synthetic_dir),
        "--out",
        str(out),
        "--split",
        "all",
        "--limit",
        "8",
        "--k",
        "5,20",
        "--locator-model",
        str(tiny_qwen3_dir),
        "--locator-allow-unknown-settings",
    ]
    assert main(argv) == 0
    comparison = json.loads((out / "compare.json").read_text())
    assert comparison["methods"] == [
        "none",
        "rules",
        "top-day",
        "top-days",
        "dbscan-paper",
        "dbscan-tuned",
        "timeline",
        "locator",
        "oracle",
    ]
    assert comparison["n_queries"] == 8
    table = comparison["table"]
    # An untrained locator writes no parseable JSON: every query falls back to the
    # semantic-only path, so it retrieves exactly what `none` retrieves.
    assert table["locator"]["recall@20"] == table["none"]["recall@20"]
    assert comparison["mcnemar"]["locator_vs"]["none"] == {"b": 0, "c": 0, "p": 1.0, "n": 8}
    assert table["locator"]["parse_fail"] == 1.0 and "parse_fail" not in table["none"]
    assert table["oracle"]["window_iou"] == 1.0 and table["oracle"]["switch_acc"] == 1.0
    assert set(comparison["mcnemar"]["locator_vs"]) == {
        "none",
        "rules",
        "top-day",
        "top-days",
        "dbscan-paper",
        "dbscan-tuned",
        "timeline",
    }
    for name in ("compare.md", "compare.png", "retrieval/recall_at_k.png", "retrieval/report.json"):
        assert (out / name).exists(), name
    printed = capsys.readouterr().out
    assert "locator" in printed and "Oracle gap" in printed
    # every output failed to parse: the command says so loudly
    assert "WARNING: locator: 100% of its outputs did not parse" in printed

    stage = out / "retrieval" / "retrieve-locator.jsonl"
    lines = stage.read_text().splitlines()
    assert len(lines) == 8
    assert main(argv) == 0  # resume: every record is already there
    assert stage.read_text().splitlines() == lines
    assert json.loads((out / "compare.json").read_text())["table"] == table


def test_compare_cli_requires_locator(synthetic_dir, tmp_path):
    from tider.cli import main

    with pytest.raises(SystemExit, match="--locator-url or --locator-model"):
        main(["eval", "compare", "--dataset", "synthetic", "--path", str(synthetic_dir), "--out", str(tmp_path)])


@pytest.mark.slow
def test_compare_with_a_locator_whose_predictions_parse(fixed_window_locator, tmp_path):
    """A locator that answers with the evidence day (``tests/conftest.py``) through the CLI:
    its windows must parse, reach the retriever and show in every part of the comparison."""
    from tider.cli import main

    data, checkpoint = fixed_window_locator
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "eval",
                "compare",
                "--dataset",
                "jsonl",
                "--path",
                str(data),
                "--out",
                str(out),
                "--split",
                "all",
                "--k",
                "5,20",
                "--baselines",
                "none,timeline",
                "--locator-model",
                str(checkpoint),
            ]
        )
        == 0
    )
    comparison = json.loads((out / "compare.json").read_text())
    table = comparison["table"]
    assert table["locator"]["parse_fail"] == 0.0 and comparison["n_queries"] == 30
    assert table["locator"]["window_iou"] == 1.0 and table["locator"]["switch_acc"] == 1.0
    assert table["none"]["recall@20"] < 0.5 < table["locator"]["recall@20"] == table["oracle"]["recall@20"]
    mcnemar = comparison["mcnemar"]["locator_vs"]["none"]
    assert mcnemar["b"] > 0 and mcnemar["c"] == 0 and mcnemar["p"] < 0.05
    assert comparison["oracle_gap"]["recall@20"]["captured"] == pytest.approx(1.0)
