"""`tider eval <subcommand>`: the evaluation group.

Each subcommand lives in its own module exposing ``register(eval_subparsers)``:
``eval_retrieval`` (retrieval metrics), ``eval_qa`` (answer accuracy) and
``eval_compare`` (locator vs baselines). Modules listed in ``EVAL_SUBCOMMANDS`` that are
not present yet are skipped, so each owner adds theirs without touching this file.
"""

from __future__ import annotations

import importlib

EVAL_SUBCOMMANDS = ["tider.commands.eval_retrieval", "tider.commands.eval_qa", "tider.commands.eval_compare"]


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate retrieval, QA and window sources (stage-wise, resumable)")
    sub = parser.add_subparsers(dest="eval_command", metavar="<eval command>", required=True)
    for name in EVAL_SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:  # a real missing dependency inside the module: surface it
                raise
            continue
        module.register(sub)
