"""QA report: accuracy (judge) and token F1 per window source x context kind, per
category and per gold-window bucket; context tokens; LLM tokens per stage (T-Mem
Table 6 style); typed-failure counts. Built from the latest ok record per query key."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from statistics import mean

LLM_STAGES = ("locator", "select", "structure", "answer", "judge")


def _mean(xs) -> float | None:
    xs = list(xs)
    return round(mean(xs), 4) if xs else None


def _group(records: list[dict], field: str) -> dict:
    groups = defaultdict(list)
    for r in records:
        groups[r[field]].append(r)
    return {
        k: {"n": len(v), "accuracy": _mean(float(r["correct"]) for r in v), "f1": _mean(r["f1"] for r in v)}
        for k, v in sorted(groups.items())
    }


def _tokens(records: dict) -> dict:
    out = defaultdict(int)
    for r in records.values():
        for k, v in (r.get("llm") or {}).items():
            out[k] += v
    return dict(out)


def forest_stats(structure: dict, compressed: dict) -> dict:
    """Shape of the forests (nodes, trees, edge labels) and what compression removed."""
    nodes = [len(r["forest"]["nodes"]) for r in structure.values()]
    edges = [e for r in structure.values() for e in r["forest"]["edges"]]
    return {
        "nodes_mean": _mean(nodes),
        "trees_mean": _mean(n - len(r["forest"]["edges"]) for n, r in zip(nodes, structure.values())),
        "update_edges": sum(e["relation"] == "UPDATE" for e in edges),
        "expand_edges": sum(e["relation"] == "EXPAND" for e in edges),
        "omitted_spans_mean": _mean(r.get("omitted_spans", 0) for r in compressed.values()),
        "metadata_tokens_mean": _mean(r.get("metadata_tokens", 0) for r in compressed.values()),
    }


def evidence_in_context(compressed: dict, gold_ids: dict) -> float | None:
    """Mean share of a query's gold evidence messages present in its final context (flat:
    survived truncation; forest: a node, possibly with spans omitted), over queries that
    have gold evidence."""
    shares = [
        len(set(gold_ids[k]) & set(r["context_ids"])) / len(gold_ids[k])
        for k, r in compressed.items()
        if gold_ids.get(k)
    ]
    return _mean(shares)


def build_qa_report(
    records: dict[str, dict[str, dict]], windows, contexts, n_queries: int, gold_ids: dict | None = None
) -> dict:
    """``gold_ids`` (query key -> gold evidence ids) adds ``evidence_in_context``; gold is
    read here, after the run, never by the stages."""
    report = {"n_queries": n_queries, "runs": {}}
    for w in windows:
        select, structure = records.get(f"select-{w}", {}), records.get(f"structure-{w}", {})
        for c in contexts:
            judged = list(records.get(f"judge-{w}-{c}", {}).values())
            compressed = records.get(f"compress-{w}-{c}", {})
            answers = records.get(f"answer-{w}-{c}", {})
            stage_tokens = {
                "locator": _tokens(records.get(f"retrieve-{w}", {})),
                "select": _tokens(select),
                "answer": _tokens(answers),
                "judge": _tokens(records.get(f"judge-{w}-{c}", {})),
            }
            if c == "forest":
                stage_tokens["structure"] = _tokens(structure)
            report["runs"][f"{w}/{c}"] = {
                "window_source": w,
                "context": c,
                "n": len(judged),
                "accuracy": _mean(float(r["correct"]) for r in judged),
                "f1": _mean(r["f1"] for r in judged),
                "by_category": _group(judged, "category"),
                "by_bucket": _group(judged, "bucket"),
                "context_tokens_mean": _mean(r["tokens"] for r in compressed.values()),
                "context_over_budget": sum(bool(r.get("over_budget")) for r in compressed.values()),
                "evidence_in_context": evidence_in_context(compressed, gold_ids or {}),
                "errors": {
                    "select_calls_failed": sum(r.get("errors", 0) for r in select.values()),
                    "select_invalid_ids": sum(r.get("invalid_ids", 0) for r in select.values()),
                    "structure_calls_failed": sum(r.get("errors", 0) for r in structure.values())
                    if c == "forest"
                    else 0,
                    "answer_failed": sum(r.get("error") is not None for r in answers.values()),
                    "judge_no_verdict": sum(r.get("error") == "no_verdict" for r in judged),
                    "judge_failed": sum(r.get("error") not in (None, "no_verdict", "no_answer") for r in judged),
                },
                "llm_tokens": stage_tokens,
            }
            if c == "forest" and structure:
                report["runs"][f"{w}/{c}"]["forest"] = forest_stats(structure, compressed)
    return report


def _llm_tokens(run: dict, stage: str) -> int:
    """Prompt plus completion tokens a run's LLM calls spent on ``stage``."""
    return sum(run["llm_tokens"].get(stage, {}).get(k, 0) for k in ("prompt_tokens", "completion_tokens"))


def qa_markdown(report: dict) -> str:
    variant = ", ".join(f"{k}={v}" for k, v in report.get("variant", {}).items())
    lines = [
        f"# QA evaluation ({report.get('dataset', '?')}, {report['n_queries']} queries)",
        "",
        (
            f"Variant: {variant}; reader: {report.get('reader')}; judge: {report.get('judge')}; "
            f"budget tokenizer: {report.get('tokenizer')}"
        ),
        "",
        (
            "| windows | context | n | accuracy | F1 | ctx tokens | gold evidence in ctx | locator tok | select tok "
            "| structure tok | answer tok | judge tok | errors |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"].values():
        tok = {stage: _llm_tokens(run, stage) for stage in ("locator", "select", "structure", "answer", "judge")}
        errs = ", ".join(f"{k}={v}" for k, v in run["errors"].items() if v) or "0"
        lines.append(
            f"| {run['window_source']} | {run['context']} | {run['n']} | {run['accuracy']} | {run['f1']} | "
            f"{run['context_tokens_mean']} | {run.get('evidence_in_context')} | {tok['locator']} | {tok['select']} | "
            f"{tok['structure']} | {tok['answer']} | {tok['judge']} | {errs} |"
        )
    forests = [(name, run["forest"]) for name, run in report["runs"].items() if "forest" in run]
    if forests:
        lines += [
            "",
            "| run | nodes | trees | UPDATE edges | EXPAND edges | omitted spans | metadata tokens | over budget |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, f in forests:
            lines.append(
                f"| {name} | {f['nodes_mean']} | {f['trees_mean']} | {f['update_edges']} | {f['expand_edges']} | "
                f"{f['omitted_spans_mean']} | {f['metadata_tokens_mean']} | "
                f"{report['runs'][name]['context_over_budget']} |"
            )
    lines += ["", "Per category (accuracy / F1 / n):", ""]
    for name, run in report["runs"].items():
        if not run["by_category"]:
            continue
        cats = "; ".join(f"{k}: {v['accuracy']}/{v['f1']}/{v['n']}" for k, v in run["by_category"].items())
        buckets = "; ".join(f"{k}: {v['accuracy']}/{v['f1']}/{v['n']}" for k, v in run["by_bucket"].items())
        lines.append(f"- {name}: categories {cats}; gold-window buckets {buckets}")
    return "\n".join(lines) + "\n"


def write_qa_report(report: dict, out_dir) -> None:
    out = Path(out_dir)
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    (out / "report.md").write_text(qa_markdown(report))
