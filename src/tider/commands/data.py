"""`tider data stats`, `tider data synth` and `tider data get`."""

from __future__ import annotations

import argparse
import os

from tider.data import LOADERS

DATASET_NAMES = sorted(LOADERS)


def register(subparsers) -> None:
    parser = subparsers.add_parser("data", help="dataset statistics and the synthetic benchmark")
    sub = parser.add_subparsers(dest="data_command", metavar="<data command>", required=True)

    stats = sub.add_parser(
        "stats", help="counts: conversations, sessions, messages, queries by category / window bucket"
    )
    stats.add_argument("--dataset", required=True, choices=DATASET_NAMES)
    stats.add_argument("--path", default=None, help="file or directory (synthetic: omit for the embedded default)")
    stats.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    stats.set_defaults(func=run_stats)

    synth = sub.add_parser("synth", help="write the synthetic benchmark in the generic JSONL format")
    synth.add_argument("--out", required=True, help="output directory (messages.jsonl, queries.jsonl, dataset.json)")
    synth.add_argument("--messages", type=int, default=None, help="total messages (default: the embedded default size)")
    synth.add_argument("--conversations", type=int, default=16)
    synth.add_argument("--seed", type=int, default=0)
    synth.set_defaults(func=run_synth)

    get = sub.add_parser("get", help="download a public benchmark (locomo, longmemeval, realmem), checksummed")
    get.add_argument("name", help="locomo | longmemeval | realmem")
    get.add_argument("--out", default="data", help="the data folder: NAME/ is made in it (default: data)")
    get.add_argument(
        "--mirror",
        default=os.environ.get("TIDER_DATA_MIRROR"),
        help="a base URL laid out as BASE/NAME/FILE, read instead of the public sources ($TIDER_DATA_MIRROR)",
    )
    get.set_defaults(func=run_get)


def run_get(args: argparse.Namespace) -> int:
    from tider.data.sources import DownloadError, get

    try:
        get(args.name, args.out, args.mirror)
    except DownloadError as err:
        raise SystemExit(f"tider data get: {err}") from None
    return 0


def run_stats(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from tider.data import DatasetError, load_dataset
    from tider.data.stats import dataset_stats

    try:
        dataset = load_dataset(args.dataset, args.path)
    except DatasetError as exc:
        # Bad input is the user's to fix: one clear line (file + record), no traceback.
        raise SystemExit(f"tider data stats: {exc}") from None
    stats = dataset_stats(dataset)
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    table = Table(title=f"{stats['dataset']} ({args.path or 'embedded default'})")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for key in (
        "granularity",
        "conversations",
        "sessions",
        "messages",
        "queries",
        "temporal_queries",
        "unresolved_evidence",
    ):
        table.add_row(key, str(stats[key]))
    for name, count in stats["by_category"].items():
        table.add_row(f"category {name}", str(count))
    for bucket, count in stats["by_window_bucket"].items():
        table.add_row(f"gold windows {bucket}", str(count))
    for key, value in stats["loader"].items():
        table.add_row(f"loader: {key}", json.dumps(value) if isinstance(value, (dict, list)) else str(value))
    Console().print(table)
    return 0


def run_synth(args: argparse.Namespace) -> int:
    from tider.data.synth import DEFAULT_MESSAGES, generate, write

    dataset = generate(args.messages or DEFAULT_MESSAGES, seed=args.seed, n_conversations=args.conversations)
    root = write(dataset, args.out)
    print(f"wrote {sum(len(m) for m in dataset.memories.values())} messages, {len(dataset.queries)} queries to {root}")
    return 0
