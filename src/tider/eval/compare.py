"""``tider eval compare``: the learned locator against every learning-free window source,
on the same retriever and (with a reader) the same forest back end.

Built on the retrieval harness (``tider.eval.retrieval``) and, when a reader is given, the
QA harness (``tider.eval.qa``): both run stage-wise into ``<out>/retrieval`` and
``<out>/qa`` and resume there. This module only chooses the methods and reads their
reports into one comparison:

- one table: recall@k, nDCG@20, MRR, window IoU, switch accuracy (+ QA accuracy/F1);
- per query category and per gold-window bucket (recall@20, window IoU);
- exact McNemar (all-evidence hit@20) between ``locator`` and each learning-free baseline:
  ``rules``, ``top-day``, both DBSCAN variants, ``timeline``, and ``none`` — which with the
  default hybrid semantic channel is the strongest semantic-only retriever;
- for a dataset combined from several (``tider.data.combine``), the same table and McNemar
  per dataset (``per_dataset``), from the same per-query records;
- the oracle gap: the share of the none -> oracle recall@k gain the locator captures,
  ``(locator - none) / (oracle - none)``;
- ``compare.json``, ``compare.md`` and ``compare.png``, next to the harness's own plots.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tider.data import MEMORIES_OF
from tider.eval.retrieval import DEFAULT_EXCLUDE, RetrievalEvalConfig, run_retrieval_eval
from tider.eval.stats import mcnemar_markdown
from tider.retrieval.config import RetrievalConfig
from tider.types import Dataset

LEARNING_FREE = ("none", "rules", "top-day", "top-days", "dbscan-paper", "dbscan-tuned", "timeline")
LEARNED = "locator"


@dataclass
class CompareConfig:
    baselines: Sequence[str] = LEARNING_FREE
    source_options: dict = field(default_factory=dict)  # {"locator": {"url": ...}, "prompted": {...}}
    oracle: bool = True
    ks: Sequence[int] = (5, 10, 20, 50)
    mcnemar_k: int = 20
    exclude_categories: Sequence[str] = DEFAULT_EXCLUDE
    memory_keys: Sequence[str] | None = None
    limit: int | None = None
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    store: str | None = None  # where retrieval searches the memories (RetrievalEvalConfig.store)

    @property
    def methods(self) -> list[str]:
        if LEARNED not in self.source_options:
            raise ValueError("compare needs the locator: source_options['locator'] = {'url': ...} or {'model': ...}")
        prompted = ["prompted"] if "prompted" in self.source_options else []
        return list(self.baselines) + prompted + [LEARNED] + (["oracle"] if self.oracle else [])


def mcnemar_vs_locator(pairs: dict, baselines: Sequence[str]) -> dict:
    """Re-orient the harness's pairwise McNemar to ``locator vs X``: b = locator hits, X misses."""
    out = {}
    for x in baselines:
        if f"{LEARNED} vs {x}" in pairs:
            r = pairs[f"{LEARNED} vs {x}"]
            out[x] = {"b": r["b"], "c": r["c"], "p": r["p"], "n": r["n"]}
        elif f"{x} vs {LEARNED}" in pairs:
            r = pairs[f"{x} vs {LEARNED}"]
            out[x] = {"b": r["c"], "c": r["b"], "p": r["p"], "n": r["n"]}
    return out


def oracle_gap(methods: dict, ks: Sequence[int], low: str = "none", high: str = "oracle") -> dict:
    """Per k: none / locator / oracle recall and the captured share of the gain."""
    if low not in methods or high not in methods or LEARNED not in methods:
        return {}
    gap = {}
    for k in ks:
        lo, hi, loc = (methods[m][f"recall@{k}"] for m in (low, high, LEARNED))
        gain = hi - lo
        gap[f"recall@{k}"] = {low: lo, LEARNED: loc, high: hi, "captured": (loc - lo) / gain if gain > 1e-12 else None}
    return gap


def parse_failure_rates(run_dir: str | Path, methods: Sequence[str]) -> dict[str, float]:
    """Share of queries whose completion did not parse, for model-backed methods."""
    from tider.eval.runner import read_records

    rates = {}
    for m in methods:
        rows = [
            r["record"] for r in read_records(Path(run_dir) / f"retrieve-{m}.jsonl").values() if r.get("status") == "ok"
        ]
        if rows and "parse_failure" in rows[0]:
            rates[m] = sum(r["parse_failure"] is not None for r in rows) / len(rows)
    return rates


def build_comparison(
    retrieval_report: dict,
    config: CompareConfig,
    qa_report: dict | None = None,
    parse_failures: dict | None = None,
) -> dict:
    ks = list(retrieval_report["ks"])
    methods = retrieval_report["methods"]
    qa = {}
    if qa_report is not None:
        for name, run in qa_report.get("runs", {}).items():  # "<window source>/<context>"
            window_source, _, context = name.partition("/")
            if context == "forest":
                qa[window_source] = {"qa_accuracy": run["accuracy"], "qa_f1": run["f1"]}
    # The main cut-off: the one the harness ran McNemar at (20 by default).
    k20 = int(retrieval_report["mcnemar"]["metric"].split("@")[-1])
    table = {}
    for m, row in methods.items():
        table[m] = {
            **{f"recall@{k}": row[f"recall@{k}"] for k in ks},
            f"ndcg@{k20}": row.get(f"ndcg@{k20}"),
            f"hit_all@{k20}": row.get(f"hit_all@{k20}"),
            "mrr": row["mrr"],
            "window_iou": row["window_iou"],
            "switch_acc": row["switch_acc"],
            "n": row["n"],
            **qa.get(m, {}),
        }
        if parse_failures and m in parse_failures:
            table[m]["parse_fail"] = parse_failures[m]
    per = lambda key: {
        m: {
            g: {f"recall@{k20}": v.get(f"recall@{k20}"), "window_iou": v.get("window_iou"), "n": v["n"]}
            for g, v in groups.items()
        }
        for m, groups in retrieval_report[key].items()
    }
    return {
        "dataset": retrieval_report.get("dataset"),
        "n_queries": retrieval_report.get("n_queries"),
        "ks": ks,
        "k_main": k20,
        "methods": list(methods),
        "table": table,
        "by_category": per("by_category"),
        "by_bucket": per("by_bucket"),
        "mcnemar": {
            "metric": retrieval_report["mcnemar"]["metric"],
            "locator_vs": mcnemar_vs_locator(retrieval_report["mcnemar"]["pairs"], config.baselines),
        },
        "oracle_gap": oracle_gap(methods, ks),
        "source_options": config.source_options,
    }


def _f(x) -> str:
    return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))


def table_columns(comparison: dict) -> list[str]:
    k20 = comparison["k_main"]
    cols = [f"recall@{k}" for k in comparison["ks"]] + [f"ndcg@{k20}", "mrr", "window_iou", "switch_acc"]
    if any("qa_accuracy" in row for row in comparison["table"].values()):
        cols += ["qa_accuracy", "qa_f1"]
    if any("parse_fail" in row for row in comparison["table"].values()):
        cols += ["parse_fail"]
    return cols + ["n"]


def table_markdown(comparison: dict, heading: str = "#") -> list[str]:
    """The comparison table and its McNemar section."""
    cols = table_columns(comparison)
    lines = [
        f"{heading} Locator vs baselines ({comparison['dataset']}, {comparison['n_queries']} queries)",
        "",
        "| method | " + " | ".join(cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    lines += [f"| {m} | " + " | ".join(_f(row.get(c)) for c in cols) + " |" for m, row in comparison["table"].items()]
    return lines + mcnemar_markdown(
        f"Exact McNemar, locator vs each learning-free baseline ({comparison['mcnemar']['metric']})",
        "baseline",
        comparison["mcnemar"]["locator_vs"],
        "b = locator hits and the baseline misses, c = the reverse.",
    )


def markdown(comparison: dict) -> str:
    lines = table_markdown(comparison)
    for part in comparison.get("per_dataset", {}).values():
        lines += ["", *table_markdown(part, "##")]
    gap = comparison["oracle_gap"]
    if gap:
        lines += [
            "",
            "## Oracle gap: share of the none -> oracle recall gain the locator captures",
            "",
            "| metric | none | locator | oracle | captured |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {k} | {_f(v['none'])} | {_f(v['locator'])} | {_f(v['oracle'])} | {_f(v['captured'])} |"
            for k, v in gap.items()
        ]
    for title, key in (("By category", "by_category"), ("By gold-window bucket", "by_bucket")):
        groups = list(dict.fromkeys(g for per in comparison[key].values() for g in per))
        metric = f"recall@{comparison['k_main']}"
        lines += [
            "",
            f"## {title} ({metric} / window IoU / n)",
            "",
            "| method | " + " | ".join(groups) + " |",
            "|---" * (len(groups) + 1) + "|",
        ]
        for m, per in comparison[key].items():
            cells = [
                f"{_f(per[g][metric])} / {_f(per[g]['window_iou'])} / {per[g]['n']}" if g in per else "-"
                for g in groups
            ]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(comparison: dict, path: str | Path) -> Path:
    """Grouped bars per method: recall@k for each k, window IoU and switch accuracy."""
    # A bare Figure renders to a file without pyplot, so the caller's backend (a notebook's)
    # is left as it is.
    from matplotlib.figure import Figure

    methods = comparison["methods"]
    metrics = [f"recall@{k}" for k in comparison["ks"]] + ["window_iou", "switch_acc"]
    fig = Figure(figsize=(max(7, 1.3 * len(methods)), 4))
    ax = fig.subplots()
    width = 0.8 / len(metrics)
    for i, metric in enumerate(metrics):
        ax.bar(
            [j + i * width for j in range(len(methods))],
            [comparison["table"][m].get(metric) or 0.0 for m in methods],
            width,
            label=metric,
        )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(methods))], methods)
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{comparison['dataset']}: {comparison['n_queries']} queries, same retriever")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=min(len(metrics), 4), loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path


def per_dataset(dataset: Dataset, groups: dict, run_dir: Path, config: CompareConfig, pooled: dict) -> dict:
    """The comparison of each dataset a combined one came from, from the pooled run's records."""
    from tider.eval.report import build_report
    from tider.eval.runner import read_records

    where = {key: name for name, keys in groups.items() for key in keys}
    memory_of = {q.key: q.memory_key for q in dataset.queries}
    records = {
        m: {k: r["record"] for k, r in read_records(run_dir / f"retrieve-{m}.jsonl").items() if r.get("status") == "ok"}
        for m in pooled["methods"]
    }
    out = {}
    for name in groups:
        part = {m: {k: r for k, r in rs.items() if where.get(memory_of.get(k)) == name} for m, rs in records.items()}
        if not any(part.values()):
            continue
        report = build_report(part, pooled["ks"], config.mcnemar_k)
        report["n_queries"], report["dataset"] = len(next(iter(part.values()))), name
        failures = {
            m: sum(r.get("parse_failure") is not None for r in rs.values()) / len(rs)
            for m, rs in part.items()
            if rs and "parse_failure" in next(iter(rs.values()))
        }
        out[name] = build_comparison(report, config, parse_failures=failures)
    return out


def run_compare(
    dataset: Dataset,
    config: CompareConfig,
    out_dir: str | Path,
    *,
    data_path: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    qa: dict | None = None,
) -> dict:
    """Run (or resume) the comparison into ``out_dir``; returns the comparison dict.

    ``qa``: ``{"reader": LLMClient, "judge": LLMClient, "config": QAConfig kwargs}`` to
    add QA accuracy through the forest back end for every method.
    """
    out = Path(out_dir)
    methods = config.methods
    retrieval_config = RetrievalEvalConfig(
        methods=methods,
        ks=config.ks,
        exclude_categories=config.exclude_categories,
        memory_keys=config.memory_keys,
        limit=config.limit,
        mcnemar_k=config.mcnemar_k,
        retrieval=config.retrieval,
        source_options=config.source_options,
        store=config.store,
    )
    retrieval_report = run_retrieval_eval(
        dataset, retrieval_config, out / "retrieval", data_path=data_path, overwrite=overwrite, progress=progress
    )
    qa_report = run_qa(dataset, config, out / "qa", qa, data_path, overwrite, progress) if qa is not None else None
    comparison = build_comparison(
        retrieval_report, config, qa_report, parse_failures=parse_failure_rates(out / "retrieval", methods)
    )
    groups = dataset.stats.get(MEMORIES_OF)
    if groups:
        comparison["per_dataset"] = per_dataset(dataset, groups, out / "retrieval", config, retrieval_report)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(comparison, indent=2))
    (out / "compare.md").write_text(markdown(comparison))
    plot(comparison, out / "compare.png")
    return comparison


def run_qa(dataset: Dataset, config: CompareConfig, out: Path, qa: dict, data_path, overwrite, progress) -> dict:
    """QA accuracy through the forest back end for every compared method (``run_compare``'s ``qa``)."""
    from tider.eval.qa import QAConfig, run_qa_eval

    qa_config = QAConfig(
        windows=config.methods,
        contexts=("forest",),
        memory_keys=config.memory_keys,
        limit=config.limit,
        exclude_categories=config.exclude_categories,
        retrieval=config.retrieval,
        source_options=config.source_options,
        **qa.get("config", {}),
    )
    return run_qa_eval(
        dataset, qa_config, out, qa["reader"], qa["judge"], data_path=data_path, overwrite=overwrite, progress=progress
    )


def paired_locators(before: str | Path, after: str | Path, k: int = 20, method: str = LEARNED) -> dict:
    """Two comparisons' locators on the same questions (e.g. SFT, then SFT+GRPO): each one's
    mean per-question recall@k, the paired difference ``after - before`` with its 95%
    bootstrap interval, and exact McNemar on hit_all@k (b: ``after`` finds all, ``before``
    not). Reads the ``retrieve-<method>.jsonl`` records under each ``retrieval/`` folder."""
    from tider.eval.runner import read_records
    from tider.eval.stats import mcnemar_exact, paired_bootstrap_ci

    def ok(folder) -> dict:
        path = Path(folder) / "retrieval" / f"retrieve-{method}.jsonl"
        return {key: r["record"] for key, r in read_records(path).items() if r.get("status") == "ok"}

    a, b = ok(before), ok(after)
    keys = sorted(key for key in a.keys() & b.keys() if a[key]["n_gold"])
    if not keys:
        raise ValueError(f"no question with gold evidence is scored in both {before} and {after}")
    recall = {
        name: [rs[key][f"hits@{k}"] / rs[key]["n_gold"] for key in keys] for name, rs in (("before", a), ("after", b))
    }
    return {
        "n": len(keys),
        f"recall@{k}": {name: sum(v) / len(v) for name, v in recall.items()},
        "after_minus_before": paired_bootstrap_ci([y - x for x, y in zip(recall["before"], recall["after"])]),
        "mcnemar": mcnemar_exact(
            [bool(b[key][f"all@{k}"]) for key in keys], [bool(a[key][f"all@{k}"]) for key in keys]
        ),
    }
