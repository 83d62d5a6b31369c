"""`tider <command>`: one entry point, one module per command under ``tider.commands``.

Each command module defines ``register(subparsers)`` (adds its parser, with
``set_defaults(func=...)``) and keeps heavy imports (torch, faiss, trl) inside the
function that runs, so ``tider --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Order here is the order in `tider --help`.
COMMAND_MODULES = [
    "tider.commands.data",
    "tider.commands.train",
    "tider.commands.eval",
    "tider.commands.export",
    "tider.commands.serve",
    "tider.commands.launch",
    "tider.commands.memory",
    "tider.commands.demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tider", description="Train, serve and evaluate a learned temporal-window locator for agent memory."
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Commands that forward arguments (e.g. to TrlParser) opt in with `passthrough=True`.
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "passthrough", False):
        args.extra = extra
    from tider.locator.contract import LocatorContractError

    try:
        return int(args.func(args) or 0)
    except LocatorContractError as exc:
        # A locator that cannot be prompted as trained: the message says which flag fixes it.
        raise SystemExit(f"tider {args.command}: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
