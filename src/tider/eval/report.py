"""Retrieval report: ``report.json``, ``report.md`` and matplotlib plots from run records."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from tider.eval.metrics import aggregate
from tider.eval.stats import mcnemar_markdown, pairwise_mcnemar
from tider.types import WINDOW_BUCKETS


def _grouped(records: Mapping[str, dict], field: str, ks) -> dict:
    groups = defaultdict(list)
    for r in records.values():
        groups[r[field]].append(r)
    order = WINDOW_BUCKETS if field == "bucket" else sorted(groups)
    return {g: aggregate(groups[g], ks) for g in order if g in groups}


def build_report(records: Mapping[str, Mapping[str, dict]], ks: Sequence[int], mcnemar_k: int = 20) -> dict:
    """``records``: method -> query key -> per-query record (``tider.eval.retrieval``)."""
    methods = list(records)
    keys = sorted(set.intersection(*(set(records[m]) for m in methods))) if methods else []
    outcomes = {m: [bool(records[m][k][f"all@{mcnemar_k}"]) for k in keys] for m in methods} if mcnemar_k in ks else {}
    return {
        "ks": list(ks),
        "methods": {m: aggregate(list(records[m].values()), ks) for m in methods},
        "by_category": {m: _grouped(records[m], "category", ks) for m in methods},
        "by_bucket": {m: _grouped(records[m], "bucket", ks) for m in methods},
        "mcnemar": {"metric": f"hit_all@{mcnemar_k}", "pairs": pairwise_mcnemar(outcomes)},
    }


def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def markdown(report: dict) -> str:
    ks = report["ks"]
    cols = (
        [f"recall@{k}" for k in ks]
        + [f"hit_all@{k}" for k in ks if k == 20]
        + [f"ndcg@{k}" for k in ks if k == 20]
        + ["mrr", "window_iou", "switch_acc", "switch_f1", "windows_per_query", "n"]
    )
    lines = [
        f"# Retrieval report ({report.get('dataset', '')}, {report.get('n_queries', '')} queries)",
        "",
        "| method | " + " | ".join(cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for m, row in report["methods"].items():
        lines.append(f"| {m} | " + " | ".join(_fmt(row.get(c, "")) for c in cols) + " |")
    build = report.get("index_build_s") or {}
    if build.get("memories"):
        lines += [
            "",
            (
                f"Index build per memory ({build['memories']} built in this run): mean {build['mean']} s, "
                f"p50 {build['p50']} s, p95 {build['p95']} s, max {build['max']} s"
            ),
        ]
    for title, key in (
        ("By category (recall@20 / hit_all@20 / n)", "by_category"),
        ("By gold-window bucket (recall@20 / hit_all@20 / n)", "by_bucket"),
    ):
        groups = list(dict.fromkeys(g for per in report[key].values() for g in per))
        names = report.get("category_names", {}) if key == "by_category" else {}
        header = [f"{g} {names[g]}" if g in names else g for g in groups]
        lines += ["", f"## {title}", "", "| method | " + " | ".join(header) + " |", "|---" * (len(groups) + 1) + "|"]
        for m, per in report[key].items():
            cells = [
                f"{per[g].get('recall@20', 0):.3f} / {per[g].get('hit_all@20', 0):.3f} / {per[g]['n']}"
                if g in per
                else "-"
                for g in groups
            ]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += mcnemar_markdown(
        f"Exact McNemar on {report['mcnemar']['metric']}",
        "pair",
        report["mcnemar"]["pairs"],
        "b = first method hits and second misses, c = the reverse.",
    )
    return "\n".join(lines) + "\n"


def plot(report: dict, out_dir: str | Path) -> list[Path]:
    # A bare Figure renders to a file without pyplot, so the caller's backend (a notebook's)
    # is left as it is.
    from matplotlib.figure import Figure

    out_dir = Path(out_dir)
    ks = report["ks"]
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for m, row in report["methods"].items():
        ax.plot(ks, [row[f"recall@{k}"] for k in ks], marker="o", label=m)
    (
        ax.set_xlabel("k"),
        ax.set_ylabel("evidence recall@k"),
        ax.set_xscale("log"),
        ax.set_xticks(ks, [str(k) for k in ks]),
    )
    ax.grid(alpha=0.3), ax.legend(fontsize=8)
    fig.tight_layout()
    curves = out_dir / "recall_at_k.png"
    fig.savefig(curves, dpi=120)

    methods = list(report["by_bucket"])
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    width = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        per = report["by_bucket"][m]
        ax.bar(
            [b + i * width for b in range(len(WINDOW_BUCKETS))],
            [per.get(g, {}).get("recall@20", 0.0) for g in WINDOW_BUCKETS],
            width,
            label=m,
        )
    ax.set_xticks([b + 0.4 - width / 2 for b in range(len(WINDOW_BUCKETS))], [f"{g} windows" for g in WINDOW_BUCKETS])
    ax.set_ylabel("evidence recall@20"), ax.legend(fontsize=8), ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    bars = out_dir / "recall_by_bucket.png"
    fig.savefig(bars, dpi=120)
    return [curves, bars]


def write_report(report: dict, out_dir: str | Path) -> None:
    out_dir = Path(out_dir)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, sort_keys=False))
    (out_dir / "report.md").write_text(markdown(report))
    plot(report, out_dir)
