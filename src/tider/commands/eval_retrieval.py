"""`tider eval retrieval`: recall@k / all-evidence hit@k / nDCG / MRR, window IoU, switch
accuracy, per category and gold-window bucket, and exact McNemar between window sources."""

from __future__ import annotations

import argparse

from tider.commands.eval_options import (
    add_store_option,
    add_window_source_options,
    require_options_for,
    split_csv,
    window_source_options,
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "retrieval", help="retrieval metrics for each window source (same dual-channel retriever)"
    )
    p.add_argument("--dataset", required=True, help="dataset loader name (locomo, longmemeval, jsonl, synthetic)")
    p.add_argument("--path", default=None, help="dataset file or directory")
    p.add_argument(
        "--windows",
        default="none,dbscan-paper,dbscan-tuned,timeline,oracle",
        help="comma-separated window sources; NAME@MODE overrides the semantic channel (dense|bm25|hybrid)",
    )
    p.add_argument("--k", default="5,10,20,50", help="comma-separated cut-offs")
    p.add_argument("--out", required=True, help="run directory (JSONL records, manifest, report.json/md, plots)")
    p.add_argument("--semantic", default=None, choices=["dense", "bm25", "hybrid"], help="default semantic channel")
    p.add_argument("--config", default=None, help="YAML/JSON file with RetrievalConfig fields")
    p.add_argument("--exclude-categories", default="5,adversarial", help="query categories to skip ('' keeps all)")
    p.add_argument("--memories", default=None, help="comma-separated memory keys to evaluate (default: all)")
    p.add_argument(
        "--split",
        default=None,
        choices=["train", "validation", "test", "non-test"],
        help="evaluate only the memories of this conversation-level split (tider.data.splits.split_keys)",
    )
    p.add_argument("--limit", type=int, default=None, help="first N eligible queries (smoke runs)")
    add_store_option(p)
    p.add_argument("--overwrite", action="store_true", help="discard earlier records in --out and start over")
    add_window_source_options(p)  # --locator-url/-model/-meta, --prompted-url/-model
    p.set_defaults(func=run)


def load_retrieval_config(path: str | None, semantic: str | None):
    from dataclasses import replace

    from tider.retrieval.config import RetrievalConfig

    config = RetrievalConfig.load(path) if path else RetrievalConfig()
    return replace(config, semantic=semantic) if semantic else config


def split_memory_keys(memory_keys, split: str) -> list[str]:
    from tider.data.splits import split_keys

    splits = split_keys(memory_keys)
    return splits["train"] + splits["validation"] if split == "non-test" else splits[split]


def run(args: argparse.Namespace) -> int:
    from tider.data import load_dataset
    from tider.eval.report import markdown
    from tider.eval.retrieval import RetrievalEvalConfig, run_retrieval_eval

    dataset = load_dataset(args.dataset, args.path)
    memory_keys = split_csv(args.memories) if args.memories else None
    if args.split:
        memory_keys = split_memory_keys(memory_keys or dataset.memories, args.split)
    config = RetrievalEvalConfig(
        methods=split_csv(args.windows),
        ks=[int(k) for k in split_csv(args.k)],
        exclude_categories=split_csv(args.exclude_categories),
        memory_keys=memory_keys,
        limit=args.limit,
        retrieval=load_retrieval_config(args.config, args.semantic),
        source_options=window_source_options(args),
        store=args.store,
    )
    require_options_for(config.methods, config.source_options)
    report = run_retrieval_eval(dataset, config, args.out, data_path=args.path, overwrite=args.overwrite)
    print(markdown(report))
    return 0
