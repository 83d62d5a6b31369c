"""`tider eval compare`: locator vs none / dbscan-paper / dbscan-tuned / timeline / prompted /
oracle on the same retriever (and forest back end with a reader): one table, per category
and gold-window bucket, exact McNemar locator vs each learning-free baseline, oracle gap, plots.
"""

from __future__ import annotations

import argparse

from tider.commands.eval_options import (
    add_store_option,
    add_window_source_options,
    require_options_for,
    split_csv,
    window_source_options,
)


def register(eval_subparsers) -> None:
    p = eval_subparsers.add_parser(
        "compare",
        help="the locator against every learning-free window source (+ oracle)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dataset",
        required=True,
        help="dataset loader name (locomo, realmem, longmemeval, jsonl, synthetic); a,b for several",
    )
    p.add_argument("--path", default=None, help="dataset file or directory (comma-separated, one per dataset)")
    p.add_argument("--out", required=True, help="run directory (retrieval/, qa/, compare.json/md/png); resumable")
    p.add_argument(
        "--baselines",
        default="none,rules,top-day,top-days,dbscan-paper,dbscan-tuned,timeline",
        help="learning-free window sources; NAME@MODE overrides the semantic channel",
    )
    p.add_argument("--no-oracle", action="store_true", help="leave out the gold-window upper bound")
    p.add_argument("--k", default="5,10,20,50", help="comma-separated cut-offs (20 is used for McNemar)")
    p.add_argument(
        "--semantic",
        default=None,
        choices=["dense", "bm25", "hybrid"],
        help="semantic channel for every method (default: the retrieval config's, hybrid)",
    )
    p.add_argument("--config", default=None, help="YAML/JSON file with RetrievalConfig fields")
    p.add_argument(
        "--split",
        default="test",
        choices=["train", "validation", "test", "heldout", "all"],
        help="conversation-level split to evaluate (the locator trains on 'train'); "
        "heldout = validation + test; all = every memory",
    )
    p.add_argument("--split-seed", type=int, default=0, help="seed of the split (the training recipe's split_seed)")
    p.add_argument(
        "--memories", default=None, help="comma-separated memory keys to evaluate (a fixed split's; overrides --split)"
    )
    p.add_argument("--exclude-categories", default="5,adversarial", help="query categories to skip ('' keeps all)")
    p.add_argument("--limit", type=int, default=None, help="first N eligible queries (smoke runs)")
    add_store_option(p)
    p.add_argument("--overwrite", action="store_true", help="discard earlier records in --out and start over")
    add_window_source_options(p)
    qa = p.add_argument_group("QA accuracy through the forest back end (optional)")
    qa.add_argument("--reader", default=None, help="reader: OpenAI-compatible base URL or local checkpoint")
    qa.add_argument("--reader-model", default=None)
    qa.add_argument("--judge", default=None, help="judge URL or checkpoint (default: the reader)")
    qa.add_argument("--judge-model", default=None)
    qa.add_argument("--classifier", default="llm", choices=["llm", "lexical"], help="forest relation classifier")
    qa.add_argument("--no-thinking", action="store_true", help="enable_thinking=false for Qwen3 readers")
    p.set_defaults(func=run)


def rich_table(comparison: dict):
    from rich.table import Table

    from tider.eval.compare import LEARNED, table_columns

    cols = table_columns(comparison)
    table = Table(title=f"{comparison['dataset']}: {comparison['n_queries']} queries, same retriever")
    table.add_column("method", style="bold")
    for c in cols:
        table.add_column(c, justify="right")
    for m, row in comparison["table"].items():
        cells = [
            "-" if row.get(c) is None else (f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c])) for c in cols
        ]
        table.add_row(m, *cells, style="green" if m == LEARNED else None)
    return table


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from tider.commands.eval_retrieval import load_retrieval_config
    from tider.data import load_datasets
    from tider.data.splits import memory_keys_of
    from tider.eval.compare import CompareConfig, markdown, run_compare

    options = window_source_options(args)
    require_options_for(["locator"], options)
    dataset = load_datasets(args.dataset, args.path)
    if args.memories:
        memory_keys = split_csv(args.memories)
    else:
        memory_keys = memory_keys_of(dataset.memories, args.split, seed=args.split_seed)
    config = CompareConfig(
        baselines=split_csv(args.baselines),
        source_options=options,
        oracle=not args.no_oracle,
        ks=[int(k) for k in split_csv(args.k)],
        exclude_categories=split_csv(args.exclude_categories),
        memory_keys=memory_keys,
        limit=args.limit,
        retrieval=load_retrieval_config(args.config, args.semantic),
        store=args.store,
    )
    qa = None
    if args.reader:
        from tider.llm.client import make_client

        cache = str(Path(args.out) / "llm_cache.sqlite")
        Path(args.out).mkdir(parents=True, exist_ok=True)
        kwargs = {"enable_thinking": False} if args.no_thinking else None
        reader = make_client(args.reader, model=args.reader_model, cache_path=cache, chat_template_kwargs=kwargs)
        judge = (
            reader
            if not args.judge
            else make_client(args.judge, model=args.judge_model, cache_path=cache, chat_template_kwargs=kwargs)
        )
        qa = {"reader": reader, "judge": judge, "config": {"classifier": args.classifier}}
    comparison = run_compare(dataset, config, args.out, data_path=args.path, overwrite=args.overwrite, qa=qa)
    console = Console(width=max(Console().width, 150))  # the table is wide; a pipe defaults to 80 columns
    console.print(rich_table(comparison))
    sections = markdown(comparison).split("\n## ", 1)  # the table above, then gap, McNemar, breakdowns
    if len(sections) == 2:
        console.print("## " + sections[1], markup=False, soft_wrap=True)
    console.print(
        f"report: {Path(args.out) / 'compare.md'}, plots: {Path(args.out) / 'compare.png'}, "
        f"{Path(args.out) / 'retrieval'}/*.png"
    )
    warn_parse_failures(comparison, console)
    return 0


PARSE_FAILURE_WARNING = 0.1  # above this share of unusable outputs, the locator row mostly measures the fallback


def warn_parse_failures(comparison: dict, console) -> list[str]:
    """A loud warning for each model-backed source whose outputs failed to parse more than a
    tenth of the time: those queries fell back to no windows, so its row is mostly ``none``'s."""
    warnings = []
    for method, row in comparison["table"].items():
        rate = row.get("parse_fail")
        if rate is not None and rate > PARSE_FAILURE_WARNING:
            warnings.append(
                f"WARNING: {method}: {rate:.0%} of its outputs did not parse (more than {PARSE_FAILURE_WARNING:.0%}); "
                f"those queries took the semantic path, so this row mostly measures 'none'. Is the model trained "
                f"for this prompt version and data? See {method}'s parse_failure counts in the retrieval records."
            )
    for line in warnings:
        console.print(line, style="bold red", markup=False, soft_wrap=True)
    return warnings
